"""Leases on work units (jobs/worker/lease.py) and done markers: exclusive, kept alive, expiring."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time


from jobs.output.done import done_units, mark_done
from jobs.worker.lease import Leaser
from jobs.output.leases import lease_path, live_leases, read_lease
from sinks import ShardRecord

CTX = mp.get_context("fork")  # children only touch files


def _race(plan_dir, unit, start, results):
    start.wait()
    lease = Leaser(plan_dir, f"w{os.getpid()}", ttl_s=60).try_take(unit)
    results.put(lease is not None)
    time.sleep(1.0)  # hold it while the others try


def test_exactly_one_of_many_racing_workers_gets_a_unit(tmp_path):
    start, results = CTX.Barrier(6), CTX.Queue()
    procs = [CTX.Process(target=_race, args=(tmp_path, 3, start, results)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert sorted(got) == [False] * 5 + [True]


def _hold(plan_dir, unit, ttl, ready):
    Leaser(plan_dir, "holder", ttl_s=ttl).try_take(unit)
    ready.set()
    signal.pause()


def _holder(tmp_path, unit, ttl):
    ready = CTX.Event()
    proc = CTX.Process(target=_hold, args=(tmp_path, unit, ttl, ready))
    proc.start()
    assert ready.wait(10)
    return proc


def test_heartbeat_keeps_a_lease_alive_past_its_ttl_and_a_stopped_holder_loses_it(tmp_path):
    proc = _holder(tmp_path, 0, ttl=0.8)
    other = Leaser(tmp_path, "other", ttl_s=60)
    try:
        time.sleep(2.0)  # 2.5 ttls: alive only because the holder beats
        assert other.try_take(0) is None
        assert [h.owner for h in live_leases(tmp_path)] == ["holder"]
        os.kill(proc.pid, signal.SIGSTOP)  # alive but silent: a hung node
        time.sleep(1.5)
        assert live_leases(tmp_path) == []
        lease = other.try_take(0)  # expiry hands the unit over
        assert lease is not None and lease.held()
        assert read_lease(lease_path(tmp_path, 0)).owner == "other"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    other.release_all()
    assert not lease_path(tmp_path, 0).exists()


def test_a_killed_holder_on_this_host_is_taken_over_at_once(tmp_path):
    proc = _holder(tmp_path, 5, ttl=3600)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert live_leases(tmp_path) == []  # its process is gone: no need to wait an hour
    restart = Leaser(tmp_path, "restart", ttl_s=60)
    assert restart.try_take(5) is not None
    restart.release_all()


def test_a_taken_over_lease_is_seen_lost_by_its_old_holder(tmp_path):
    old = Leaser(tmp_path, "old", ttl_s=0.4)
    lease = old.try_take(1)
    old._stop.set()  # the old holder hangs: no more heartbeats
    time.sleep(0.6)
    new = Leaser(tmp_path, "new", ttl_s=60)
    assert new.try_take(1) is not None
    assert not old.still_held(1) and new.still_held(1)
    lease.touch()  # a late heartbeat of the old holder touches its own (renamed) inode only
    assert read_lease(lease_path(tmp_path, 1)).owner == "new"
    old.release(1)  # and its release leaves the new lease in place
    assert new.still_held(1)
    new.release_all()


def test_a_unit_is_marked_done_once(tmp_path):
    rec = ShardRecord("shard-u0000002-0000.tar", 2, 10, "ab", ["a", "b"])
    assert mark_done(tmp_path, 2, [rec], "w1") is True
    assert mark_done(tmp_path, 2, [], "w2") is False
    assert done_units(tmp_path) == {2}
    assert not [p for p in (tmp_path / "done").iterdir() if p.name.startswith(".")]


def test_a_killed_holder_not_yet_reaped_counts_as_gone(tmp_path):
    proc = _holder(tmp_path, 6, ttl=3600)
    os.kill(proc.pid, signal.SIGKILL)
    time.sleep(0.5)  # a zombie now: its parent (this test) has not waited for it
    try:
        assert live_leases(tmp_path) == []
    finally:
        proc.join(10)


def test_a_damaged_lease_expires_by_its_mtime_and_names_itself(tmp_path):
    """A lease file that does not parse was fresh forever: a rerun waited for it without end, and job.overwrite
    was refused for its 'live lease'. It now ages from its mtime (a live holder still touches it)."""
    path = lease_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    fresh = read_lease(path)
    assert fresh.unit == 1 and not fresh.expired() and str(path) in fresh.describe()
    assert [lease.unit for lease in live_leases(tmp_path)] == [1]
    assert Leaser(tmp_path, "w", ttl_s=60).try_take(1) is None  # a holder may still be at work
    hours_ago = time.time() - 7200
    os.utime(path, (hours_ago, hours_ago))
    assert read_lease(path).expired() and live_leases(tmp_path) == []
    taker = Leaser(tmp_path, "w", ttl_s=60)
    assert taker.try_take(1) is not None and read_lease(path).owner == "w"
    taker.release_all()
