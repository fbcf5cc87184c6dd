"""Per-shard parquet and _stats.json (sinks/sidecars.py): round trip against the tars, one schema
for the run, and every crash window of the commit (tar first, sidecars after, manifest last)."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from sinks import AsyncSink, Sample, SinkConfig, scan_output
from sinks.manifest import load_manifest, manifest_path
from sinks.names import QUARANTINE_DIR
from sinks.sidecars import MetaSpec, sidecar_names

SPEC = MetaSpec(columns=(("prompt", "string"), ("seed", "int64"), ("ok", "bool"), ("mode", "string"),
                         ("scale", "float64")), tally=("mode", "ok"))


def samples(n: int, start: int = 0):
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        meta = {"prompt": f"prompt {i}", "seed": 2**62 + i, "ok": i % 3 != 0, "mode": "replay" if i % 2 else "eager",
                "scale": 4.5, "extra": [i]}  # `extra` is not a column: it stays in the json only
        if i == 1:
            del meta["prompt"]  # a missing field is a null, not a schema change
        yield Sample(f"k{i}", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), f"caption {i}", meta)


def write(out, n=7, maxcount=3, failures=()):
    with AsyncSink(out, SinkConfig(format="png", maxcount=maxcount), spec=SPEC) as sink:
        for s in samples(n):
            sink.put(s)
            if s.key in failures:
                sink.note_failure(f"{s.key}-lost", "nonfinite")
    return sink.records


def tar_rows(path):
    rows = {}
    with tarfile.open(path) as tar:
        for m in tar:
            stem = m.name.split(".", 1)[0]
            row = rows.setdefault(stem, {"members": [], "bytes": 0})
            row["members"].append(m.name)
            row["bytes"] += m.size
            if m.name.endswith(".json"):
                row["json"] = json.loads(tar.extractfile(m).read())
    return list(rows.values())


def test_parquet_rows_are_the_tar_samples(tmp_path):
    records = write(tmp_path, failures={"k4"})
    assert [r.nsamples for r in records] == [3, 3, 1]
    for r in records:
        parquet, stats = sidecar_names(r.url)
        assert [e[0] for e in r.sidecars] == [parquet, stats]
        table = pq.read_table(tmp_path / parquet)
        assert table.schema == SPEC.schema()
        got = table.to_pylist()
        for row, want in zip(got, tar_rows(tmp_path / r.url), strict=True):
            meta = want["json"]
            assert row["key"] == meta["key"] and row["shard"] == r.url
            assert row["members"] == want["members"] and row["bytes"] == want["bytes"]
            for name, _ in SPEC.columns:
                assert row[name] == meta.get(name)
        assert [row["key"] for row in got] == r.keys
    assert pq.read_table(tmp_path / "shard-000000.parquet").column("prompt").to_pylist()[1] is None


def test_stats_count_successes_failures_and_tallies(tmp_path):
    write(tmp_path, failures={"k4"})
    stats = json.loads((tmp_path / "shard-000001_stats.json").read_text())
    # k3, k4, k5 written; the failure noted after k4 counts in the same shard
    assert (stats["count"], stats["successes"], stats["failures"]) == (4, 3, 1)
    assert stats["status_dict"] == {"nonfinite": 1, "success": 3}
    assert stats["values"]["mode"] == {"eager": 1, "replay": 2} and stats["values"]["ok"] == {"false": 1, "true": 2}
    assert stats["bytes"] == (tmp_path / "shard-000001.tar").stat().st_size
    assert stats["end_time"] >= stats["start_time"] and stats["duration"] >= 0
    assert stats["shard"] == "shard-000001.tar"


def test_the_run_is_one_table(tmp_path):
    write(tmp_path, n=8)
    (tmp_path / "summary.json").write_text("{}")
    files = sorted(str(p) for p in tmp_path.glob("*.parquet"))
    table = ds.dataset(files, format="parquet").to_table()
    assert sorted(table.column("key").to_pylist()) == sorted(f"k{i}" for i in range(8))
    # pyarrow's directory discovery skips `_manifest/` (leading `_`) and the temps (leading `.`),
    # and with exclude_invalid_files it also passes over the tars and json beside the parquet.
    found = ds.dataset(str(tmp_path), format="parquet", exclude_invalid_files=True)
    assert sorted(found.files) == files


def _crash_after_tar(tmp_path, records, keep_sidecars: bool):
    """Undo what a crash after the tar's commit would not have done."""
    for r in records:
        manifest_path(tmp_path, r.url).unlink()
        if not keep_sidecars:
            for name in sidecar_names(r.url):
                (tmp_path / name).unlink()


def test_shard_without_sidecars_gets_them_rebuilt_from_the_tar(tmp_path):
    records = write(tmp_path)
    before = {r.url: (tmp_path / sidecar_names(r.url)[0]).read_bytes() for r in records}
    _crash_after_tar(tmp_path, records, keep_sidecars=False)
    scan = scan_output(tmp_path, spec=SPEC)
    assert scan.rebuilt == [r.url for r in records] and scan.quarantined == []
    for r in scan.records:
        assert (tmp_path / sidecar_names(r.url)[0]).read_bytes() == before[r.url]  # the same table, same bytes
        stats = json.loads((tmp_path / sidecar_names(r.url)[1]).read_text())
        assert stats["rebuilt"] and stats["successes"] == r.nsamples and stats["duration"] is None
        assert load_manifest(tmp_path, r.url).sidecars == r.sidecars


def test_sidecars_without_a_manifest_are_adopted(tmp_path):
    records = write(tmp_path)
    _crash_after_tar(tmp_path, records, keep_sidecars=True)
    scan = scan_output(tmp_path, spec=SPEC)
    assert [r.sidecars for r in scan.records] == [r.sidecars for r in records]  # same names, sizes, sha256


def test_damaged_or_missing_sidecar_is_rebuilt_and_the_shard_kept(tmp_path):
    records = write(tmp_path)
    (tmp_path / "shard-000000.parquet").write_bytes(b"PAR1 damaged")
    (tmp_path / "shard-000001_stats.json").unlink()
    scan = scan_output(tmp_path, spec=SPEC)
    assert scan.quarantined == [] and scan.rebuilt == ["shard-000000.tar", "shard-000001.tar"]
    assert pq.read_table(tmp_path / "shard-000000.parquet").column("key").to_pylist() == records[0].keys
    assert json.loads((tmp_path / "shard-000001_stats.json").read_text())["rebuilt"]
    assert scan_output(tmp_path, verify="full", spec=SPEC).rebuilt == []  # settled


def test_parquet_whose_shard_is_gone_is_quarantined(tmp_path):
    write(tmp_path)
    (tmp_path / "shard-000002.tar").unlink()
    scan = scan_output(tmp_path, spec=SPEC)
    moved = sorted(q["url"] for q in scan.quarantined)
    assert moved == ["shard-000002.parquet", "shard-000002_stats.json"]
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == ["shard-000000.parquet", "shard-000001.parquet"]


def test_quarantined_shard_takes_its_sidecars_along(tmp_path):
    write(tmp_path)
    with open(tmp_path / "shard-000001.tar", "r+b") as f:
        f.truncate(1024)
    scan = scan_output(tmp_path, spec=SPEC)
    assert [q["url"] for q in scan.quarantined] == ["shard-000001.tar"]
    assert not list(tmp_path.glob("shard-000001*"))
    names = sorted(p.name for p in (tmp_path / QUARANTINE_DIR).iterdir())
    assert names == ["log.jsonl", "shard-000001.tar", "shard-000001.tar.manifest.json", "shard-000001.tar.parquet",
                     "shard-000001.tar.stats.json"]


@pytest.mark.parametrize("bad", [(("key", "string"),), (("a", "string"), ("a", "int64"))])
def test_spec_refuses_reserved_or_repeated_columns(bad):
    with pytest.raises(AssertionError):
        MetaSpec(columns=bad)


def test_jobs_verify_names_a_changed_parquet_and_one_without_its_shard(tmp_path):
    from jobs.output.audit import verify_output
    from sinks import write_wids_index

    records = write(tmp_path)
    write_wids_index(tmp_path, records)
    (tmp_path / "run.json").write_text("{}")
    assert verify_output(tmp_path).problems == []
    (tmp_path / "shard-000000.parquet").write_bytes(b"PAR1 damaged")
    stray = tmp_path / "shard-000009.parquet"
    stray.write_bytes((tmp_path / "shard-000001.parquet").read_bytes())
    problems = verify_output(tmp_path).problems
    assert any(p.startswith("shard-000000.tar: shard-000000.parquet: ") for p in problems), problems
    assert any(p.startswith("shard-000009.parquet: its shard is missing") for p in problems), problems
    assert len(problems) == 2, problems
