"""A shard exists under its final name only when complete, and committed shards are never rewritten.

Proved with abort(), Ctrl-C inside the context manager, a real writer process SIGKILLed
mid-write, and a resume that must skip every committed name.
"""

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from sinks import AsyncSink, CorruptShardError, Sample, SinkConfig, record_from_tar, scan_output
from sinks.manifest import load_manifest, manifest_path, write_manifest
from sinks.tar_shard import TarShard

REPO = Path(__file__).resolve().parents[1]


def samples(n, prefix="k", size=8):
    rng = np.random.default_rng(1)
    return [Sample(f"{prefix}{i}", rng.integers(0, 256, (size, size, 3), dtype=np.uint8), f"c{i}") for i in range(n)]


def digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).glob("shard-*.tar"))}


def test_abort_leaves_only_committed_shards(tmp_path):
    sink = AsyncSink(tmp_path, SinkConfig(format="png", maxcount=4))
    for s in samples(10):
        sink.put(s)
    committed_before = sink.commit_now()  # 10 samples: shards 0, 1 full, shard 2 holds 2
    assert committed_before.url == "shard-000002.tar"
    for s in samples(3, prefix="late"):
        sink.put(s)
    sink.abort()
    sink.abort()  # idempotent
    assert sorted(p.name for p in tmp_path.glob("shard-*.tar")) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert list(tmp_path.glob(".*")) == []
    with pytest.raises(RuntimeError, match="the sink is closed"):
        sink.put(samples(1)[0])


def test_ctrl_c_inside_the_context_drops_only_the_open_shard(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=3)) as sink:
            for i, s in enumerate(samples(8)):
                sink.put(s)
                if i == 6:
                    sink.commit_now()  # make the state at the interrupt known: 2 full shards + 1 open
                    sink.put(samples(9)[8])
                    raise KeyboardInterrupt
    assert [r.nsamples for r in scan_output(tmp_path).records] == [3, 3, 1]
    assert list(tmp_path.glob(".*")) == []


def test_commit_never_replaces_an_existing_final_file(tmp_path):
    (tmp_path / "shard-000000.tar").write_bytes(b"precious")
    shard = TarShard(tmp_path / "shard-000000.tar")
    shard.add(_encoded("k"))
    with pytest.raises(FileExistsError):
        shard.commit()
    assert (tmp_path / "shard-000000.tar").read_bytes() == b"precious"


def _encoded(key):
    from sinks.sample import encode_sample

    return encode_sample(samples(1, prefix=key)[0], "png", 95)


def test_resume_skips_committed_names_and_keeps_their_bytes(tmp_path):
    config = SinkConfig(format="png", maxcount=4)
    with AsyncSink(tmp_path, config) as sink:
        for s in samples(8):
            sink.put(s)
    before = digests(tmp_path)
    assert len(before) == 2
    (tmp_path / ".shard-000002.tar.tmp").write_bytes(b"partial tar from a killed run")
    scan = scan_output(tmp_path)
    assert scan.removed_temps == [".shard-000002.tar.tmp"]
    done = {k for r in scan.records for k in r.keys}
    with AsyncSink(tmp_path, config, start_index=0) as sink:  # start_index 0 on purpose: names are taken
        for s in samples(12):
            if s.key not in done:
                sink.put(s)
    assert [r.url for r in sink.records] == ["shard-000002.tar"]
    after = digests(tmp_path)
    assert {name: after[name] for name in before} == before
    assert sorted(k for r in scan_output(tmp_path, verify="full").records for k in r.keys) == sorted(f"k{i}" for i in range(12))


def test_missing_or_corrupt_manifest_is_rebuilt_from_the_tar(tmp_path):
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=3)) as sink:
        for s in samples(7):
            sink.put(s)
    truth = sink.records
    manifest_path(tmp_path, "shard-000000.tar").unlink()  # crash between commit and manifest
    manifest_path(tmp_path, "shard-000001.tar").write_text("{not json")
    scan = scan_output(tmp_path)
    assert scan.records == truth and scan.quarantined == []
    assert scan.rebuilt == ["shard-000000.tar", "shard-000001.tar"]
    assert scan_output(tmp_path).rebuilt == []  # rewritten manifests are trusted next time


def test_a_shard_that_disagrees_with_its_manifest_is_quarantined(tmp_path):
    """The manifest is the witness of the commit: the shard is not trusted over it."""
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=3)) as sink:
        for s in samples(7):
            sink.put(s)
    stale = load_manifest(tmp_path, "shard-000002.tar")  # a whole manifest (its digest made anew) of another size
    stale.filesize += 512
    write_manifest(tmp_path, stale)
    scan = scan_output(tmp_path)
    assert [r.url for r in scan.records] == ["shard-000000.tar", "shard-000001.tar"]
    assert [(q["url"], q["moved_to"], q["reason"]) for q in scan.quarantined] == [
        ("shard-000002.tar", "_quarantine/shard-000002.tar", "file size 10240 bytes, manifest says 10752")]
    assert (tmp_path / "_quarantine" / "shard-000002.tar").exists() and not (tmp_path / "shard-000002.tar").exists()
    assert (tmp_path / "_quarantine" / "shard-000002.tar.manifest.json").exists()


def test_damaged_shard_without_manifest_is_quarantined_not_adopted(tmp_path):
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=3)) as sink:
        for s in samples(6):
            sink.put(s)
    path = tmp_path / "shard-000000.tar"
    path.write_bytes(path.read_bytes()[:700])  # damaged after commit: truncated copy
    manifest_path(tmp_path, path.name).unlink()
    scan = scan_output(tmp_path)
    assert [r.url for r in scan.records] == ["shard-000001.tar"]
    assert scan.quarantined[0]["url"] == "shard-000000.tar"
    assert scan.quarantined[0]["reason"] == ("cannot be read as a tar (ReadError: unexpected end of data: the file ends at "
                                             "byte 700, inside member 0)")
    with pytest.raises(CorruptShardError, match=r"shard-000001.tar cannot be read as a shard.*move it aside and rerun"):
        (tmp_path / "shard-000001.tar").write_bytes(b"\0" * 10240)
        record_from_tar(tmp_path, "shard-000001.tar")


CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    from sinks import AsyncSink, Sample, SinkConfig
    out, mode = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    sink = AsyncSink(out, SinkConfig(format="png", maxcount=5, encode_threads=2, queue_size=4))
    for i in range(100000):
        if mode == "parked" and i == 10:
            sink.flush()                      # shards 0, 1 committed ...
            for j in range(10, 12):           # ... and shard 2 open with 2 samples
                sink.put(Sample(f"k{j}", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)))
            while not any(p.startswith(".shard-000002") for p in __import__("os").listdir(out)):
                pass
            import time; time.sleep(0.2)
            print("parked", flush=True)
            time.sleep(600)
        size = 8 if mode == "parked" else 96
        sink.put(Sample(f"k{i}", rng.integers(0, 256, (size, size, 3), dtype=np.uint8)))
    """
)


def _spawn(out, mode):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(out), mode], env=env, stdout=subprocess.PIPE, text=True)


def _check_after_kill(out, expect_temp):
    names = sorted(p.name for p in out.iterdir() if p.name != "_manifest")
    # A kill can also land between a shard's commit and its manifest write: a manifest temp.
    temps = [str(p.relative_to(out)) for p in out.rglob(".*.tmp")]
    if expect_temp:
        assert temps, names
    for name in names:
        if name.endswith(".tar"):
            with tarfile.open(out / name) as tar:  # every final-name file is a complete tar of 5 samples
                assert len(tar.getmembers()) == 15, name
        elif not name.endswith(".tmp"):  # a parquet or stats file under its final name has its shard
            assert name.endswith((".parquet", "_stats.json")), name
            assert name.replace("_stats.json", ".tar").replace(".parquet", ".tar") in names, name
    scan = scan_output(out)
    assert sorted(scan.removed_temps) == sorted(temps)
    assert not any(p.name.endswith(".tmp") for p in out.rglob(".*"))
    keys = [k for r in scan.records for k in r.keys]
    assert keys == [f"k{i}" for i in range(len(keys))]  # committed = a prefix of the put order
    return scan


def test_sigkill_with_an_open_shard_leaves_no_partial_final_file(tmp_path):
    child = _spawn(tmp_path, "parked")
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready and child.stdout.readline().strip() == "parked"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    scan = _check_after_kill(tmp_path, expect_temp=True)
    assert [r.url for r in scan.records] == ["shard-000000.tar", "shard-000001.tar"]
    assert scan.removed_temps == [".shard-000002.tar.tmp"]


@pytest.mark.parametrize("delay", [0.6, 0.95, 1.3])
def test_sigkill_of_a_busy_writer_at_any_moment(tmp_path, delay):
    child = _spawn(tmp_path, "busy")
    deadline = time.monotonic() + 30
    # Wait until it has committed something, then kill it at an arbitrary later instant.
    while not (tmp_path / "shard-000000.tar").exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(delay - 0.5)
    child.send_signal(signal.SIGKILL)
    child.wait()
    scan = _check_after_kill(tmp_path, expect_temp=False)
    assert scan.records


def test_a_manifest_edited_in_place_is_read_as_damaged_and_the_shard_rebuilds_it(tmp_path, caplog):
    # Found by the S3 property test's seed 232: one bit turned a member's name into another ("k006.jsol"); the
    # manifest still parsed, matched the tar's size and sha256, and was taken for the facts.
    import logging

    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=3)) as sink:
        for s in samples(6):
            sink.put(s)
    path = manifest_path(tmp_path, "shard-000000.tar")
    whole = load_manifest(tmp_path, "shard-000000.tar")
    doc = json.loads(path.read_text())
    assert doc["manifest_version"] == 5 and len(doc["digest"]) == 64
    doc["members"][1][0] = doc["members"][1][0][:-1] + "l"
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        assert load_manifest(tmp_path, "shard-000000.tar") is None
        scan = scan_output(tmp_path)  # no owner: a manifest is rebuilt from a whole tar
    assert "its own digest does not match: damaged" in caplog.text
    assert [r.url for r in scan.records] == ["shard-000000.tar", "shard-000001.tar"] and scan.quarantined == []
    assert load_manifest(tmp_path, "shard-000000.tar").members == whole.members


def test_a_manifest_written_before_the_digest_is_read_as_it_is(tmp_path):
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=3)) as sink:
        for s in samples(3):
            sink.put(s)
    path = manifest_path(tmp_path, "shard-000000.tar")
    doc = json.loads(path.read_text())
    del doc["digest"]
    path.write_text(json.dumps(dict(doc, manifest_version=4)))
    assert load_manifest(tmp_path, "shard-000000.tar").sha256 == doc["sha256"]
