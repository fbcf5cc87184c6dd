"""The per-user cache of file digests (jobs/plan/digest_cache.py): a fresh run on unchanged weights
reads none of them; any change the kernel's ctime sees, even one that keeps size and mtime, hashes
the file again; a damaged or unwritable cache costs a hash, never a wrong digest."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from jobs.plan.digest_cache import DigestCache, cache_file
from jobs.plan.digests import file_digest


class Counting:
    """file_digest, counting the files it reads."""

    def __init__(self) -> None:
        self.read: list = []

    def __call__(self, path: Path) -> str:
        self.read.append(path.name)
        return file_digest(path)


def _weights(tmp_path: Path) -> Path:
    f = tmp_path / "model.safetensors"
    f.write_bytes(os.urandom(1 << 16))
    return f


def test_an_unchanged_file_is_read_once_across_runs(tmp_path):
    f, store = _weights(tmp_path), tmp_path / "cache" / "file_digests.json"
    first, count = DigestCache(store), Counting()
    d1 = first.digest(f, count)
    first.save()
    second = DigestCache(store)  # the next run: a new process reading the saved cache
    assert second.digest(f, count) == d1 == file_digest(f)
    assert count.read == ["model.safetensors"] and (second.hits, second.misses) == (1, 0)


def test_an_edit_that_keeps_size_and_mtime_is_hashed_again(tmp_path):
    f, store = _weights(tmp_path), tmp_path / "file_digests.json"
    cache = DigestCache(store)
    before = cache.digest(f, file_digest)
    cache.save()
    st = os.stat(f)
    time.sleep(0.05)  # past the timestamp clock's tick: the edit's ctime is a later one
    with open(f, "r+b") as fh:  # same size
        fh.write(b"\x00" * 16)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime back
    assert os.stat(f).st_mtime_ns == st.st_mtime_ns and os.stat(f).st_size == st.st_size
    count = Counting()
    after = DigestCache(store).digest(f, count)
    assert count.read == ["model.safetensors"] and after == file_digest(f) != before


def test_a_replaced_file_misses(tmp_path):
    f, store = _weights(tmp_path), tmp_path / "file_digests.json"
    cache = DigestCache(store)
    cache.digest(f, file_digest)
    cache.save()
    new = tmp_path / "new.bin"
    new.write_bytes(os.urandom(1 << 16))
    os.replace(new, f)  # another inode at the same path
    count = Counting()
    assert DigestCache(store).digest(f, count) == file_digest(f) and count.read


def test_a_damaged_cache_is_ignored_and_rewritten(tmp_path):
    f, store = _weights(tmp_path), tmp_path / "file_digests.json"
    store.write_text('{"' + str(f) + '": {"digest": "not this')  # torn
    cache = DigestCache(store)
    assert cache.digest(f, file_digest) == file_digest(f)
    cache.save()
    assert json.loads(store.read_text())[os.path.realpath(f)]["digest"] == file_digest(f)
    # a well-formed entry with a wrong stamp is not trusted either
    entries = json.loads(store.read_text())
    entries[os.path.realpath(f)].update(digest="0" * 64, ino=-1)
    store.write_text(json.dumps(entries))
    assert DigestCache(store).digest(f, file_digest) == file_digest(f)


def test_an_unwritable_cache_only_forgets(tmp_path):
    f = _weights(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cache = DigestCache(blocker / "file_digests.json")  # its folder cannot be made
    assert cache.digest(f, file_digest) == file_digest(f)
    cache.save()  # logs, does not raise
    assert not (tmp_path / "a_file").is_dir()


def test_where_it_lives():
    assert cache_file({"BCGEN_DIGEST_CACHE": "off"}) is None
    assert cache_file({"BCGEN_DIGEST_CACHE": "/x/d.json"}) == Path("/x/d.json")
    assert cache_file({"BCGEN_CACHE_DIR": "/c"}) == Path("/c/file_digests.json")
    assert cache_file({}).name == "file_digests.json"
