"""Committed shards are checked, not trusted: corrupt them two ways, rerun, and read everything back.

One output_dir through: a clean job, `jobs.verify` (OK), a same-size byte flip in one shard's image
and the last members cut from another's, `jobs.verify` (names both), a rerun with job.verify=full
(moves both to _quarantine/, generates their keys again, leaves the third shard's bytes alone),
`jobs.verify` (OK again).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from sinks import AsyncSink, Sample, SinkConfig, scan_output
from sinks.manifest import indexed_records
from tests.helpers import prompts, write_jsonl
from tests.test_resume_kill import FAST, cli, log_of, shard_bytes, shard_keys


def verify_cli(out: Path):
    return cli(str(out), module=("-m", "jobs.verify"))


def flip_image_byte(path: Path) -> None:
    """Same size, same headers: one payload byte of the first image changes."""
    with tarfile.open(path) as tar:
        image = next(m for m in tar if m.name.endswith(".jpg"))
    data = bytearray(path.read_bytes())
    data[image.offset_data + image.size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def cut_last_members(path: Path, n: int) -> None:
    """Drop the last n members and close the tar again: a valid tar, often of the very same size
    (tar pads to 10 KiB records), whose last sample has no json or txt."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    end = members[-n].offset
    data = path.read_bytes()[:end] + b"\0" * (2 * tarfile.BLOCKSIZE)
    data += b"\0" * (-len(data) % tarfile.RECORDSIZE)
    path.write_bytes(data)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    rows = prompts(8)
    data = write_jsonl(tmp / "prompts.jsonl", rows)
    out = tmp / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST]
    steps = {"first": cli(*args)}
    steps["verify_clean"] = verify_cli(out)
    steps["bytes_before"] = shard_bytes(out)
    flip_image_byte(out / "shard-u0000000-0000.tar")
    cut_last_members(out / "shard-u0000000-0001.tar", 2)
    steps["size_after_cut"] = (out / "shard-u0000000-0001.tar").stat().st_size
    steps["verify_corrupt"] = verify_cli(out)
    steps["rerun"] = cli(*args, "job.verify=full")
    steps["verify_after"] = verify_cli(out)
    return {"rows": rows, "out": out, "args": args, **steps}


def test_clean_output_verifies(chain):
    proc = chain["verify_clean"]
    assert proc.returncode == 0, log_of(proc)
    assert "OK; 3 shard(s), 8 sample(s) read back" in log_of(proc)


def test_verify_names_both_corruptions(chain):
    proc = chain["verify_corrupt"]
    assert proc.returncode == 1, log_of(proc)
    text = log_of(proc)
    assert "shard-u0000000-0000.tar: does not match its manifest: sha256 differs from the manifest's" in text
    assert "shard-u0000000-0001.tar: does not match its manifest: " in text
    assert re.search(r"7 members, manifest lists 9: missing (k\d+)\.json, \1\.txt \(a plain rerun repairs it: "
                     r"python -m jobs.generate .*: it moves the shard to _quarantine/", text)
    assert "key(s) of done units are in no shard" in text  # the samples the two damaged shards held
    assert "3 problem(s)" in text


def test_rerun_quarantines_both_and_generates_their_keys_again(chain):
    proc, out = chain["rerun"], chain["out"]
    assert proc.returncode == 0, log_of(proc)
    text = log_of(proc)
    assert "shard shard-u0000000-0000.tar does not match what was committed (sha256 differs" in text
    assert "shard shard-u0000000-0001.tar does not match what was committed (" in text
    assert re.search(r"7 members, manifest lists 9: missing (k\d+)\.json, \1\.txt\)", text)
    assert "resume: 1 of 1 done unit(s) no longer held what they committed and were reopened (0); 2 shard(s) moved" in text
    assert shard_keys(out) == Counter({r["key"]: 1 for r in chain["rows"]})
    # The untouched shard keeps its bytes; the regenerated keys are in new shards.
    after = shard_bytes(out)
    assert after["shard-u0000000-0002.tar"] == chain["bytes_before"]["shard-u0000000-0002.tar"]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(q["url"] for q in summary["quarantined"]) == ["shard-u0000000-0000.tar", "shard-u0000000-0001.tar"]
    assert summary["items_written"] == 6 and summary["items_skipped_done"] == 2
    assert sorted(p.name for p in (out / "_quarantine").glob("*.tar")) == ["shard-u0000000-0000.tar", "shard-u0000000-0001.tar"]


def test_verify_is_clean_after_the_rerun(chain):
    proc = chain["verify_after"]
    assert proc.returncode == 0, log_of(proc)
    assert "8 sample(s) read back" in log_of(proc)


def test_stray_tar_is_never_indexed_and_verify_names_it(chain, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(chain["out"], out)
    shutil.copy(out / "shard-u0000000-0002.tar", out / "shard-u0000000-0002 (copy).tar")
    shutil.copy(out / "shard-u0000000-0002.tar", out / "backup.tar")
    assert [r.url for r in indexed_records(out)] == [r.url for r in indexed_records(chain["out"])]
    scan = scan_output(out)
    assert scan.strays == ["shard-u0000000-0002 (copy).tar"] and scan.quarantined == []
    proc = verify_cli(out)
    # Not the run's, so not the run's problem: listed apart, left alone, never indexed (issue 26).
    assert proc.returncode == 0, log_of(proc)
    assert "not the run's: backup.tar: a .tar with no manifest" in log_of(proc)
    assert "not the run's: shard-u0000000-0002 (copy).tar: a .tar with no manifest" in log_of(proc)
    assert "OK (2 file(s) in it are not the run's, listed above)" in log_of(proc)


def test_a_stray_parquet_is_named_with_the_fix_and_a_glob_of_the_folder_would_read_it(chain, tmp_path):
    """A copy of a shard's parquet dropped beside the sidecars, under another name, in a subfolder: the
    folder's readers see its rows twice, and verify names each, apart from the problems (verify said OK of
    `x.parquet`; of `shard-... copy.parquet` it said a rerun would quarantine it, which a rerun does not)."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    shutil.copytree(chain["out"], out)
    real = out / "shard-u0000000-0002.parquet"
    (out / "backup").mkdir()
    strays = ["shard-u0000000-0002 copy.parquet", "x.parquet", "backup/shard-u0000000-0002.parquet"]
    for name in strays:
        shutil.copy(real, out / name)
    shutil.copy(out / "shard-u0000000-0002_stats.json", out / "shard-u0000000-0002 copy_stats.json")
    keys = pq.read_table(sorted(map(str, out.glob("*.parquet"))), columns=["key"]).column("key").to_pylist()
    assert len(keys) == 8 + 2 * pq.read_metadata(real).num_rows  # what a glob of the folder reads
    files = ds.dataset(str(out), format="parquet", exclude_invalid_files=True).files
    assert str(out / "backup/shard-u0000000-0002.parquet") in files  # and pyarrow's discovery

    proc = verify_cli(out)
    text = log_of(proc)
    assert proc.returncode == 0, text
    for name in strays[:2]:
        assert (f"not the run's: {name}: a parquet no manifest names (a copy?): duckdb's read_parquet('OUTPUT_DIR/"
                f"*.parquet') and pyarrow.dataset('OUTPUT_DIR') read its rows beside the run's; left alone") in text
    assert ("not the run's: backup/shard-u0000000-0002.parquet: a parquet no manifest names (a copy?): "
            "pyarrow.dataset('OUTPUT_DIR') reads its rows") in text
    assert "not the run's: shard-u0000000-0002 copy_stats.json: a stats file no manifest names" in text
    assert "move it out of output_dir" in text and "problem:" not in text
    assert "OK (4 file(s) in it are not the run's, listed above)" in text
    assert "_plan/" not in text  # its unit parquet files are the run's bookkeeping, which readers skip


def test_members_level_catches_cut_members_of_the_same_size_but_not_payload_flips(tmp_path):
    """job.verify=members reads headers only: cheap, and blind to a changed image byte (that is `full`)."""
    import numpy as np

    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=4)) as sink:
        for i in range(8):
            sink.put(Sample(f"k{i}", np.full((8, 8, 3), i, np.uint8), caption=f"c{i}"))
    size = (tmp_path / "shard-000001.tar").stat().st_size
    cut_last_members(tmp_path / "shard-000001.tar", 2)
    assert (tmp_path / "shard-000001.tar").stat().st_size == size  # the size alone cannot tell
    data = bytearray((tmp_path / "shard-000000.tar").read_bytes())
    with tarfile.open(tmp_path / "shard-000000.tar") as tar:
        png = next(m for m in tar if m.name.endswith(".png"))
    data[png.offset_data + 20] ^= 0x01
    mtime = (tmp_path / "shard-000000.tar").stat().st_mtime_ns
    (tmp_path / "shard-000000.tar").write_bytes(bytes(data))
    os.utime(tmp_path / "shard-000000.tar", ns=(mtime, mtime))  # its stamp kept: only sha256 can tell
    scan = scan_output(tmp_path)  # members
    assert [q["url"] for q in scan.quarantined] == ["shard-000001.tar"]
    assert [r.url for r in scan.records] == ["shard-000000.tar"]
    scan = scan_output(tmp_path, verify="full")
    assert [q["url"] for q in scan.quarantined] == ["shard-000000.tar"] and scan.records == []


def test_header_reader_agrees_with_tarfile_and_checks_checksums(tmp_path):
    import numpy as np

    from sinks.tar_check import _tarfile_members, tar_members

    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=10)) as sink:
        for i, key in enumerate(["a", "b/../c.d", "é" * 40, "k" * 150]):
            sink.put(Sample(key, np.full((8, 8, 3), i, np.uint8), caption="x" * (i * 300)))
    path = tmp_path / "shard-000000.tar"
    assert tar_members(path) == _tarfile_members(path)
    with tarfile.open(path) as tar:
        second = tar.getmembers()[1]
    data = bytearray(path.read_bytes())
    data[second.offset] ^= 0x01  # one bit of the second member's name
    path.write_bytes(bytes(data))
    with pytest.raises(tarfile.ReadError, match=f"bad header checksum at byte {second.offset}"):
        tar_members(path)


def test_the_repair_command_is_the_runs_own_for_this_folder(tmp_path):
    """verify's advice took the newest Hydra log: a job refused at the door (another config) logs too, so the
    advice was a command that is refused; after a move it named the old folder; after an overwrite it wiped."""
    from jobs.output.audit import RepairAdvice

    out = tmp_path / "moved"
    for name, overrides, log in (
            ("2026-12-01_10-00-00-rank0", ["sampling.steps=2", "output_dir=/old/place", "job.overwrite=true"],
             "[jobs.run][INFO] - part 0: 8 of 8 planned items left in 1 of 1 units\n"),
            ("2026-12-02_10-00-00-rank0", ["sampling.steps=3", "output_dir=/old/place"],
             "[jobs.generate][ERROR] - output_dir='/old/place' holds a run with a different config\n")):
        (out / "logs" / name / ".hydra").mkdir(parents=True)
        (out / "logs" / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        (out / "logs" / name / "generate.log").write_text(log)
    assert RepairAdvice(out).plain == f"a plain rerun repairs it: python -m jobs.generate sampling.steps=2 output_dir={out}"
