"""Write errors (disk full, a vanished directory) -> SinkError with a message a user can act on;
committed shards keep their exact bytes and the output stays resumable.

All errors are real OS errors: a 1 MiB tmpfs (skipped where mounting is not permitted), /dev/full
behind the next temp name, and an output directory removed under a running sink.
"""

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sinks import AsyncSink, Sample, SinkConfig, SinkError, scan_output


def noise_samples(n, size=64, prefix="k"):
    rng = np.random.default_rng(2)  # noise: png cannot compress it, so bytes add up fast
    return [Sample(f"{prefix}{i}", rng.integers(0, 256, (size, size, 3), dtype=np.uint8), f"c{i}") for i in range(n)]


def digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).glob("shard-*.tar"))}


def fill_until_error(sink, samples):
    """Put samples until the sink reports its stored error; returns the SinkError."""
    with pytest.raises(SinkError) as info:
        for s in samples:
            sink.put(s)
        sink.close()
    return info.value


def assert_actionable(message):
    assert "Committed shards are intact" in message or "committed shards are intact" in message
    assert "rerun the same command" in message or "rerunning the same command" in message


def test_dev_full_behind_the_temp_name(tmp_path):
    config = SinkConfig(format="png", maxcount=4)
    sink = AsyncSink(tmp_path, config)
    for s in noise_samples(8):
        sink.put(s)
    sink.commit_now()
    committed = digests(tmp_path)
    assert sorted(committed) == ["shard-000000.tar", "shard-000001.tar"]
    # The next shard's temp file is a real device that fails every write with ENOSPC.
    os.symlink("/dev/full", tmp_path / ".shard-000002.tar.tmp")

    error = fill_until_error(sink, noise_samples(8, prefix="late"))
    message = str(error)
    assert ".shard-000002.tar.tmp (to become shard-000002.tar)" in message
    assert "No space left on device" in message
    assert "2 committed by this writer, the last is shard-000001.tar" in message
    assert_actionable(message)
    assert digests(tmp_path) == committed
    assert not os.path.lexists(tmp_path / ".shard-000002.tar.tmp")
    assert os.path.exists("/dev/full")  # the link was removed, not its target
    with pytest.raises(SinkError):
        sink.put(noise_samples(1)[0])  # stays failed
    with pytest.raises(SinkError):
        sink.close()
    assert [r.url for r in scan_output(tmp_path, verify="full").records] == sorted(committed)


def test_output_dir_removed_under_a_running_sink(tmp_path):
    out = tmp_path / "out"
    sink = AsyncSink(out, SinkConfig(format="png", maxcount=2))
    for s in noise_samples(3, size=8):
        sink.put(s)
    sink.commit_now()
    shutil.rmtree(out)  # an unmounted volume, a cleanup script: the next open fails
    error = fill_until_error(sink, noise_samples(6, size=8))
    assert "opening shard" in str(error) and "(to become shard-000002.tar) failed: FileNotFoundError" in str(error)
    assert_actionable(str(error))


def _mount_tmpfs(directory, size):
    directory.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "none", str(directory)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here ({err}); the /dev/full variant covers ENOSPC")


def test_small_filesystem_fills_up(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "1M")
    try:
        records, committed_bytes = [], {}

        def remember(record):
            records.append(record)
            committed_bytes[record.url] = (disk / record.url).read_bytes()

        sink = AsyncSink(disk, SinkConfig(format="png", maxcount=3), on_commit=remember)
        error = fill_until_error(sink, noise_samples(200))  # 200 x 12 KiB > 1 MiB
        message = str(error)
        assert "No space left on device" in message
        assert_actionable(message)
        assert records, "some shards must have been committed before the disk filled"
        # Every committed shard kept its bytes; nothing partial sits under a final name.
        for url, data in committed_bytes.items():
            assert (disk / url).read_bytes() == data
        scan = scan_output(disk)
        assert [r.url for r in scan.records] == [r.url for r in records]
        assert [k for r in scan.records for k in r.keys] == [f"k{i}" for i in range(3 * len(records))]
        assert list(disk.glob(".*.tmp")) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)
