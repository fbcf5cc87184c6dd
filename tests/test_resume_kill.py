"""Kill a running job at chosen instants (SIGKILL, SIGTERM), rerun it, and read every shard back.

The instants come from the job's test hook (BCGEN_TEST_KILL_AT, jobs/kill_hook.py): during
planning, mid-batch, and while a shard is half written. Each step keeps what the one before
committed, byte for byte, and the last rerun leaves every dataset key in exactly one shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import prompts, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false",
        "bcg.batch_sizes=[2]", "sink.maxcount=3"]


def cli(*args: str, env: dict | None = None, cwd: Path = ROOT, module: tuple = ("-m", "jobs.generate"),
        timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (a kill must not take pytest with it)."""
    # One thread per process: several jobs share CI's 2 cores, and torchrun sets the same.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # keep e.g. wheel dirs
    full_env = dict(os.environ, PYTHONPATH=path, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, *module, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def shard_keys(out: Path) -> Counter:
    """Every key in every committed shard, read back with webdataset (the reader users have)."""
    import webdataset as wds

    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    keys = Counter()
    for sample in wds.WebDataset(urls, shardshuffle=False) if urls else []:
        keys[json.loads(sample["json"])["key"]] += 1
    return keys


def shard_bytes(out: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("shard-*.tar"))}


def sidecars(out: Path) -> list:
    return sorted(p.name for p in out.glob("shard-*") if p.name.endswith((".parquet", "_stats.json")))


def temps(out: Path) -> list:
    return sorted(p.name for p in out.glob(".shard-*.tmp"))


def log_of(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def killed_chain(tmp_path_factory):
    """One output_dir through: kill in planning, kill mid-batch, kill mid-shard-write, clean rerun."""
    tmp = tmp_path_factory.mktemp("kill")
    rows = prompts(10)
    data = write_jsonl(tmp / "prompts.jsonl", rows)
    out = tmp / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST]
    steps = {}
    for name, hook in (("plan", "plan"), ("batch", "batch:3"), ("shard", "shard-write:1"), ("final", None)):
        proc = cli(*args, env={"BCGEN_TEST_KILL_AT": hook} if hook else None)
        steps[name] = {"proc": proc, "bytes": shard_bytes(out), "temps": temps(out), "keys": shard_keys(out),
                       "claimed": (out / "run.json").exists(), "sidecars": sidecars(out)}
    return {"rows": rows, "data": data, "out": out, "steps": steps, "args": args}


def test_kill_during_planning_leaves_nothing_to_undo(killed_chain):
    step = killed_chain["steps"]["plan"]
    assert step["proc"].returncode == -signal.SIGKILL, log_of(step["proc"])
    assert step["bytes"] == {} and step["temps"] == []
    assert not step["claimed"]  # killed before output_dir was claimed


def test_kill_mid_batch_keeps_only_whole_shards(killed_chain):
    step = killed_chain["steps"]["batch"]
    assert step["proc"].returncode == -signal.SIGKILL, log_of(step["proc"])
    # Batches 1-2 (4 items) and one item of batch 3 were handed to the sink; at most one full
    # shard of 3 can be committed, and whatever is under a final name reads back whole.
    assert sum(step["keys"].values()) in (0, 3) and max(step["keys"].values(), default=1) == 1


def test_kill_mid_shard_write_leaves_a_temp_not_a_shard(killed_chain):
    step = killed_chain["steps"]["shard"]
    assert step["proc"].returncode == -signal.SIGKILL, log_of(step["proc"])
    assert step["temps"], "the hook fires while a shard is open: its temp file must be left behind"
    before = killed_chain["steps"]["batch"]["bytes"]
    assert {k: v for k, v in step["bytes"].items() if k in before} == before
    assert len(step["bytes"]) > len(before)  # this run committed at least one shard first


def test_rerun_after_kills_has_every_key_once_and_keeps_committed_bytes(killed_chain):
    step = killed_chain["steps"]["final"]
    assert step["proc"].returncode == 0, log_of(step["proc"])
    assert step["temps"] == []  # the torn shard was discarded ...
    assert step["keys"] == Counter({r["key"]: 1 for r in killed_chain["rows"]})  # ... and redone
    before = killed_chain["steps"]["shard"]["bytes"]
    assert {k: v for k, v in step["bytes"].items() if k in before} == before
    out = killed_chain["out"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete"
    assert summary["items_written"] + summary["items_skipped_done"] == len(killed_chain["rows"])
    index = json.loads((out / "index.wids.json").read_text())
    assert sorted(s["url"] for s in index["shardlist"]) == sorted(step["bytes"])


def test_parquet_and_stats_follow_their_shards_through_kills(killed_chain):
    import pyarrow.dataset as ds

    for name, step in killed_chain["steps"].items():
        tars = {n[: -len(".tar")] for n in step["bytes"]}
        stems = {n[: -len(".parquet")] if n.endswith(".parquet") else n[: -len("_stats.json")] for n in step["sidecars"]}
        assert stems <= tars, f"{name}: a parquet or stats file without its shard"
    out = killed_chain["out"]
    assert stems == tars  # after the clean rerun every shard has both
    table = ds.dataset(sorted(str(p) for p in out.glob("*.parquet"))).to_table()
    assert Counter(table.column("key").to_pylist()) == killed_chain["steps"]["final"]["keys"]
    stats = [json.loads(p.read_text()) for p in out.glob("*_stats.json")]
    assert sum(s["successes"] for s in stats) == len(killed_chain["rows"])


def test_other_dataset_is_refused_then_overwrite_starts_over(killed_chain, tmp_path):
    out, args = killed_chain["out"], killed_chain["args"]
    other_rows = prompts(3)
    other_rows[0]["prompt"] = "a completely different prompt"
    other = write_jsonl(tmp_path / "other.jsonl", other_rows)
    swapped = [a if not a.startswith("dataset.path=") else f"dataset.path={other}" for a in args]
    refused = cli(*swapped)
    assert refused.returncode == 2, log_of(refused)
    assert "dataset.digest" in log_of(refused) and "job.overwrite=true" in log_of(refused)
    assert shard_bytes(out) == killed_chain["steps"]["final"]["bytes"]  # refused: nothing touched

    fresh = cli(*swapped, "job.overwrite=true")
    assert fresh.returncode == 0, log_of(fresh)
    assert shard_keys(out) == Counter({r["key"]: 1 for r in other_rows})
    assert json.loads((out / "summary.json").read_text())["items_written"] == 3
    assert {n.rsplit(".", 1)[0].removesuffix("_stats") for n in sidecars(out)} == {n[:-4] for n in shard_bytes(out)}


def test_sigterm_in_a_units_last_batch_is_a_preemption_not_complete(tmp_path):
    """The signal came in unit 0's last batch: the loop then found no next unit (the source gives none once a
    stop is asked) and the job ended `complete`, exit 0, with unit 1 never run: no scheduler requeues that."""
    rows = prompts(6)
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST, "plan.unit_items=4"]  # two units of 3 items
    stopped = cli(*args, env={"BCGEN_TEST_KILL_AT": "batch:2", "BCGEN_TEST_KILL_SIGNAL": "TERM"})
    assert stopped.returncode == 143, log_of(stopped)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["items_written"] == 3  # unit 0, whole
    resumed = cli(*args)
    assert resumed.returncode == 0, log_of(resumed)
    assert shard_keys(out) == Counter({r["key"]: 1 for r in rows})


def test_sigterm_finishes_the_batch_commits_and_exits_resumable(tmp_path):
    rows = prompts(6)
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST]
    # SIGTERM arrives after the first item of batch 2: batch 2 is finished, batch 3 never starts.
    stopped = cli(*args, env={"BCGEN_TEST_KILL_AT": "batch:2", "BCGEN_TEST_KILL_SIGNAL": "TERM"})
    assert stopped.returncode == 143, log_of(stopped)
    assert "SIGTERM received" in log_of(stopped)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["items_written"] == 4
    assert sum(shard_keys(out).values()) == 4 and temps(out) == []  # all 4 committed, nothing torn
    committed = shard_bytes(out)

    resumed = cli(*args)
    assert resumed.returncode == 0, log_of(resumed)
    assert shard_keys(out) == Counter({r["key"]: 1 for r in rows})
    assert {k: v for k, v in shard_bytes(out).items() if k in committed} == committed
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items_written"], summary["items_skipped_done"]) == ("complete", 2, 4)
