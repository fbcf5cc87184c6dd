"""Workers leasing units of one plan, through the real CLI: started at different times, killed and
restarted, mixed layouts at once, a hung worker's lease expiring, job.overwrite against a live lease
or a live worker that holds none, two workers of one part each counted in the summary.

Every test reads the shards back with webdataset and asserts each dataset key exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import prompts, write_jsonl
from tests.test_resume_kill import FAST, ROOT, cli, log_of, shard_keys

pytestmark = pytest.mark.slow


def start(*args: str, env: dict | None = None, module: str = "jobs.generate") -> subprocess.Popen:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(os.environ, PYTHONPATH=path, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out[-6000:]


def wait_stopped(proc: subprocess.Popen, timeout: float = 200) -> None:
    """Until the process has stopped itself (SIGSTOP from the test hook)."""
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, f"exited {proc.returncode}: {proc.stdout.read()[-4000:]}"
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.2)
    raise AssertionError("the worker never reached its stop point")


def wait_done(out: Path, units: int, timeout: float = 200) -> None:
    """Until `units` units are marked done."""
    end = time.time() + timeout
    while len(list((out / "_plan" / "done").glob("unit-*.json"))) < units:
        assert time.time() < end, f"fewer than {units} units done after {timeout:.0f}s"
        time.sleep(0.2)


def files(out: Path) -> dict:
    return {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*"))
            if p.is_file() and "logs" not in p.parts and "_locks" not in p.parts}


@pytest.fixture
def job(tmp_path):
    rows = prompts(12)
    rows[5]["width"] = 128  # two signatures
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST, "plan.unit_items=2"]
    return rows, out, args


def every_key_once(rows, out) -> None:
    assert shard_keys(out) == Counter({r["key"]: 1 for r in rows})
    index = json.loads((out / "index.wids.json").read_text())
    assert sum(s["nsamples"] for s in index["shardlist"]) == len(rows)


def test_four_workers_at_different_times_two_killed_and_restarted(job):
    rows, out, args = job
    planned = cli(*args, module=("-m", "jobs.plan"))
    assert planned.returncode == 0, log_of(planned)
    plan = json.loads((out / "_plan" / "plan.json").read_text())
    assert len(plan["units"]) == 7 and plan["items"] == 12  # 11 items of one signature in 6 units, 1 of the other
    # The two that get killed start first, so each surely holds a unit when it dies (at its first
    # batch, or in its second unit); the others join while they run.
    kill = {1: "batch:1", 3: "batch:2"}
    procs = {}
    for w in (1, 3, 0, 2):
        procs[w] = start(*args, f"job.partition={w}/4",
                         env={"BCGEN_TEST_KILL_AT": kill[w]} if w in kill else None)
        time.sleep(2)
    results = {w: finish(p) for w, p in sorted(procs.items())}
    for w in kill:
        assert results[w][0] == -signal.SIGKILL, results[w][1]
    restarted = {w: start(*args, f"job.partition={w}/4") for w in kill}
    results.update({f"{w}-again": finish(p) for w, p in restarted.items()})
    for w, (code, log) in results.items():
        assert w in kill or code == 0, log
    every_key_once(rows, out)
    assert len(os.listdir(out / "_plan" / "done")) == 7 and os.listdir(out / "_plan" / "leases") == []


def test_plain_and_partitioned_jobs_at_once_write_each_key_once(job):
    rows, out, args = job
    procs = [start(*args), start(*args, "job.partition=0/2"), start(*args, "job.partition=1/2")]
    results = [finish(p) for p in procs]
    assert all(code == 0 for code, _ in results), results
    every_key_once(rows, out)
    plans = sum("plan written to" in log for _, log in results)
    assert plans == 1, [log for _, log in results]  # one planned, the others joined


def test_overwrite_while_a_lease_is_live_is_refused_and_deletes_nothing(job):
    rows, out, args = job
    holder = start(*args, env={"BCGEN_TEST_KILL_AT": "batch:1", "BCGEN_TEST_KILL_SIGNAL": "STOP"})
    try:
        wait_stopped(holder)  # it holds a unit's lease, with items in flight
        before = files(out)
        refused = cli(*args, "sampling.steps=3", "job.overwrite=true")
        assert refused.returncode == 2, log_of(refused)
        assert "job.overwrite=true refused" in log_of(refused) and "Nothing was deleted" in log_of(refused)
        assert files(out) == before
    finally:
        holder.kill()
        holder.communicate()
    fresh = cli(*args, "sampling.steps=3", "job.overwrite=true")  # the holder is gone: allowed
    assert fresh.returncode == 0, log_of(fresh)
    every_key_once(rows, out)


def test_a_hung_workers_lease_expires_and_another_worker_finishes_its_unit(job):
    rows, out, args = job
    hung = start(*args, "job.lease_ttl_s=4", env={"BCGEN_TEST_KILL_AT": "batch:1", "BCGEN_TEST_KILL_SIGNAL": "STOP"})
    try:
        wait_stopped(hung)  # alive (same host, same pid) but silent: only expiry frees its unit
        other = cli(*args, "job.lease_ttl_s=4")
        assert other.returncode == 0, log_of(other)
        assert "taking over unit" in log_of(other) and "no heartbeat" in log_of(other)
    finally:
        hung.kill()
        hung.communicate()
    every_key_once(rows, out)


def test_overwrite_while_a_worker_loads_its_model_is_refused_until_it_is_gone(job):
    """A worker holds no unit's lease while it loads its model: job.overwrite wiped the folder under it (found
    in session 55), and it then failed, or wrote into the new run's folder. Its hold on the run refuses that."""
    rows, out, args = job
    holder = start(*args, env={"BCGEN_TEST_KILL_AT": "load", "BCGEN_TEST_KILL_SIGNAL": "STOP"})
    try:
        wait_stopped(holder)  # joined the plan, loading its model, no lease
        assert os.listdir(out / "_plan" / "leases") == []
        before = files(out)
        refused = cli(*args, "sampling.steps=3", "job.overwrite=true")
        text = log_of(refused)
        assert refused.returncode == 2, text
        assert "job.overwrite=true refused" in text and f"(pid {holder.pid} on " in text, text
        assert "Nothing was deleted" in text and "Wait for them to finish, or stop them" in text
        assert "Traceback" not in text and files(out) == before
    finally:
        holder.kill()
        holder.communicate()
    fresh = cli(*args, "sampling.steps=3", "job.overwrite=true")  # its process is gone: it holds nothing
    assert fresh.returncode == 0, log_of(fresh)
    every_key_once(rows, out)
    assert os.listdir(out / "_plan" / "workers") == []


def test_two_workers_of_one_part_started_by_hand_each_count_in_the_summary(job):
    """Two processes with the same job.partition wrote one part file between them: the summary counted the
    samples of whichever finished last (found in session 55). Both write here, at once: A is held while it
    loads, B takes a unit and is held mid-batch, A does the others and waits for B's unit, B ends it."""
    rows, out, args = job
    a = start(*args, env={"BCGEN_TEST_KILL_AT": "load", "BCGEN_TEST_KILL_SIGNAL": "STOP"})
    b = None
    try:
        wait_stopped(a)
        b = start(*args, env={"BCGEN_TEST_KILL_AT": "batch:1", "BCGEN_TEST_KILL_SIGNAL": "STOP"})
        wait_stopped(b)  # holds a unit's lease
        os.kill(a.pid, signal.SIGCONT)
        wait_done(out, 6)  # of 7 units: every one but the one B holds, most of them A's
        os.kill(b.pid, signal.SIGCONT)
        results = [finish(a), finish(b)]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert all(code == 0 for code, _ in results), results
    every_key_once(rows, out)
    records = sorted((out / "_summary").glob("part-0000-of-0001-*.json"))
    written = [json.loads(p.read_text())["items_written"] for p in records]
    assert len(written) == 2 and all(written), (written, results)  # each worker's own record, each wrote samples
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items_written"] == sum(shard_keys(out).values()) == len(rows)
    assert summary["items_skipped_done"] == 0 and summary["status"] == "complete"
    again = cli(*args)  # a later run of the part is a session of its own: it reports what it did
    assert again.returncode == 0, log_of(again)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["items_written"], summary["items_skipped_done"]) == (0, len(rows))
    assert len(list((out / "_summary").glob("part-*.json"))) == 1  # the earlier session's records are dropped
