"""A per-user cache of files' sha256, so a fresh run on the same weights does not read them again.

    <user cache>/file_digests.json       (the folder: jobs/user_cache.py, as for the other caches;
                                          BCGEN_DIGEST_CACHE=<file>, or =off for none)
    {"<real path>": {"dev", "ino", "bytes", "mtime_ns", "ctime_ns", "digest"}, ...}

Every fresh run records the sha256 of the weights it was made with (jobs/plan/weights_digest.py).
Hashing SANA-1.6B's folder (8 GB) takes 5-7 s, every run, though the files have not changed: that
was the planning stage's whole time on the H200 (benchmarks/results/job_wall_h200_bcg.md). A hit
needs the file's device, inode, size, mtime and ctime to be the ones recorded with its digest.
ctime is the kernel's: any write to the file or to its metadata moves it, and no utime() can set it
back, so an edit in place that keeps size and mtime still misses (the resume check's stat, which
compares size and mtime alone, would not see it). A miss hashes the file and records it.

A cache, never a source of truth: unreadable or damaged, it is ignored (and rewritten); unwritable,
the digests are only not remembered. Writes go through a temporary file and a rename, so two
processes writing at once leave one of their versions whole.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional

from jobs.user_cache import user_cache_dir

log = logging.getLogger("jobs.plan")

ENV = "BCGEN_DIGEST_CACHE"
_FIELDS = ("dev", "ino", "bytes", "mtime_ns", "ctime_ns")


def cache_file(environ: Mapping[str, str] = os.environ) -> Optional[Path]:
    """Where the cache lives, or None when BCGEN_DIGEST_CACHE=off."""
    value = environ.get(ENV)
    if value == "off":
        return None
    if value:
        return Path(value).expanduser()
    return user_cache_dir(environ) / "file_digests.json"


def _stamp(path: Path) -> Dict[str, int]:
    st = os.stat(path)
    return {"dev": st.st_dev, "ino": st.st_ino, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


class DigestCache:
    """Load once, look up and add from any thread, save once (`save`)."""

    def __init__(self, file: Optional[Path]) -> None:
        self.file = file
        self._entries: Dict[str, dict] = self._load() if file is not None else {}
        self._lock = threading.Lock()
        self._dirty = False
        self.hits = self.misses = 0

    def _load(self) -> Dict[str, dict]:
        assert self.file is not None
        try:
            data = json.loads(self.file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.info("file digest cache %s unreadable (%s): starting it again", self.file, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def digest(self, path: Path, compute: Callable[[Path], str]) -> str:
        """`path`'s sha256: the cached one while its stat stamp is unchanged, else `compute(path)`."""
        key = os.path.realpath(path)
        stamp = _stamp(path)
        entry = self._entries.get(key)
        if isinstance(entry, dict) and all(entry.get(f) == stamp[f] for f in _FIELDS) \
                and isinstance(entry.get("digest"), str):
            with self._lock:
                self.hits += 1
            return entry["digest"]
        value = compute(path)
        with self._lock:
            self.misses += 1
            if _stamp(path) == stamp:  # not remembered if the file changed while it was read
                self._entries[key] = {**stamp, "digest": value}
                self._dirty = True
        return value

    def save(self) -> None:
        if self.file is None or not self._dirty:
            return
        tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._entries, sort_keys=True))
            os.replace(tmp, self.file)
            self._dirty = False
        except OSError as exc:
            log.info("file digest cache %s not written (%s): the next run hashes again", self.file, exc)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # its folder is not there (or not a folder) either
                pass
