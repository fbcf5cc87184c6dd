"""A worker's hold on its run (jobs/worker/presence.py): it keeps job.overwrite from wiping the folder
while the worker lives, whether or not it holds a unit, and holds nothing once the worker is gone.

The holders are real processes (forked: they only touch files); the refusal is the wipe's own check.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from jobs.errors import UserError
from jobs.output.claim import refuse_while_held
from jobs.output.leases import HOST, holder_path, live_holders
from jobs.worker.presence import Presence

CTX = mp.get_context("fork")


def _hold(plan_dir, ttl, ready):
    Presence(plan_dir, "holder:part0/1", ttl).take()
    ready.set()
    signal.pause()


def _holder(output_dir, ttl):
    (output_dir / "_plan").mkdir(exist_ok=True)  # the plan it joined
    ready = CTX.Event()
    proc = CTX.Process(target=_hold, args=(output_dir / "_plan", ttl, ready))
    proc.start()
    assert ready.wait(10)
    return proc


def _end(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def test_a_live_worker_refuses_the_wipe_naming_itself_and_the_fix(tmp_path):
    proc = _holder(tmp_path, ttl=600)
    try:
        with pytest.raises(UserError) as refused:
            refuse_while_held(tmp_path)
        text = str(refused.value)
        assert f"output_dir={str(tmp_path)!r}" in text and "Nothing was deleted" in text
        assert f"worker holder:part0/1 (pid {proc.pid} on {HOST}" in text
        assert "Wait for them to finish, or stop them" in text
    finally:
        _end(proc)
    refuse_while_held(tmp_path)  # its process is gone (this host): it holds nothing, at once


def test_a_silent_worker_holds_the_run_for_its_ttl_only(tmp_path):
    proc = _holder(tmp_path, ttl=0.8)
    try:
        time.sleep(2.0)  # 2.5 ttls: live only because it beats
        assert [h.pid for h in live_holders(tmp_path / "_plan")] == [proc.pid]
        os.kill(proc.pid, signal.SIGSTOP)  # alive but silent: a hung node
        time.sleep(1.5)
        assert live_holders(tmp_path / "_plan") == []
        refuse_while_held(tmp_path)
    finally:
        _end(proc)


def test_a_released_hold_is_gone_and_a_new_hold_removes_those_of_dead_workers(tmp_path):
    plan_dir = tmp_path / "_plan"
    proc = _holder(tmp_path, ttl=600)
    _end(proc)
    dead = holder_path(plan_dir, HOST, proc.pid)
    assert dead.exists()  # SIGKILL: nobody released it
    mine = Presence(plan_dir, "me", 600)
    mine.take()
    assert not dead.exists() and [h.owner for h in live_holders(plan_dir)] == ["me"]
    mine.release()
    assert list((plan_dir / "workers").iterdir()) == []


def test_a_worker_loading_its_model_keeps_job_extend_from_replacing_its_plan(tmp_path):
    """A worker that joined the plan and holds no unit yet (loading its model): an extend would renumber the
    units under it. The real planner refuses, changes nothing, and extends once the worker is gone."""
    from jobs.plan.__main__ import plan_typed
    from tests.helpers import compose_cfg, write_jsonl

    data, out = tmp_path / "rows.jsonl", tmp_path / "out"
    rows = [{"key": k, "prompt": f"prompt {k}"} for k in "abc"]
    args = [f"dataset.path={data}", f"output_dir={out}", "plan.unit_items=2", "sampling.height=64",
            "sampling.width=64"]
    write_jsonl(data, rows[:2])
    plan_typed(compose_cfg(args))
    write_jsonl(data, rows)
    before = (out / "_plan" / "plan.json").read_bytes()
    proc = _holder(out, ttl=600)
    try:
        with pytest.raises(UserError) as refused:
            plan_typed(compose_cfg([*args, "job.extend=true"]))
        text = str(refused.value)
        assert text.startswith("job.extend=true refused") and f"pid {proc.pid} on {HOST}" in text
        assert "Nothing was changed" in text and "rerun with job.extend=true" in text
        assert (out / "_plan" / "plan.json").read_bytes() == before
    finally:
        _end(proc)
    plan_typed(compose_cfg([*args, "job.extend=true"]))
    assert (out / "_plan" / "plan.json").read_bytes() != before
