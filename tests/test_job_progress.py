"""The whole job's progress across workers (jobs/telemetry/progress.py), and TensorBoard logging."""

from __future__ import annotations

import json
import sys

import pytest

from jobs.errors import UserError
from jobs.output.layout import PROGRESS_DIR
from jobs.telemetry.progress import RateMeter, SharedProgress, format_eta
from jobs.output.done import mark_done
from sinks.manifest import ShardRecord


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def worker(tmp_path, name, inflight, clock, total=100):
    plan = tmp_path / "_plan"
    plan.mkdir(exist_ok=True)
    return SharedProgress(tmp_path, plan, name, total, lambda: dict(inflight), clock=clock)


def record(url, n):
    return ShardRecord(url, n, 10240, "0" * 64, [f"{url}-{i}" for i in range(n)])


def test_two_workers_and_done_units_make_one_view(tmp_path):
    clock = Clock()
    a_units, b_units = {3: 7}, {4: 5, 5: 2}
    a = worker(tmp_path, "part0000-host-1", a_units, clock)
    b = worker(tmp_path, "part0001-host-2", b_units, clock)
    mark_done(tmp_path / "_plan", 0, [record("u0", 20), record("u0b", 10)], "x")  # 30 items of a done unit
    a.meter.add(7)
    b.meter.add(7)
    a.publish()
    b.publish()
    view = a.view()
    assert (view.total, view.done, view.workers) == (100, 30 + 7 + 7, 2)
    # Unit 5 is marked done while b's file still lists it: its items count once, from the marker.
    mark_done(tmp_path / "_plan", 5, [record("u5", 2)], "x")
    assert a.view().done == 30 + 7 + 7
    b_units.pop(5)
    b.publish()
    assert a.view().done == 30 + 7 + 7


def test_eta_is_what_is_left_over_the_summed_rates(tmp_path):
    clock = Clock()
    a = worker(tmp_path, "a", {1: 10}, clock)
    b = worker(tmp_path, "b", {2: 30}, clock)
    a.publish()
    b.publish()
    for doc, rate in ((a, 2.0), (b, 3.0)):  # the rates the workers measured, as their files say
        data = json.loads(doc.path.read_text())
        data["rate"] = rate
        doc.path.write_text(json.dumps(data))
    a.meter.rate = lambda: 2.0
    view = a.view()
    assert (view.done, view.rate, view.eta_s) == (40, 5.0, 12.0)
    assert "job 40/100 items (40.0%), 5.00 items/s over 2 worker(s), ETA 0:00:12" == view.line()


def test_a_silent_worker_stops_counting_and_a_closed_one_is_gone(tmp_path):
    clock = Clock()
    a = worker(tmp_path, "a", {1: 10}, clock)
    b = worker(tmp_path, "b", {2: 30}, clock)
    a.publish()
    b.publish()
    assert a.view().workers == 2
    clock.t += 60  # b was killed: nothing from it for a minute (it publishes every 2 s)
    a.publish()
    assert (a.view().workers, a.view().done) == (1, 10)
    a.close()
    assert not (tmp_path / PROGRESS_DIR / "a.json").exists()


def test_rate_meter_forgets_old_samples():
    clock = Clock(0.0)
    meter = RateMeter(clock)
    for _ in range(10):
        clock.t += 10
        meter.add(100)  # 10/s for 100 s
    for _ in range(30):
        clock.t += 10
        meter.add(10)  # then 1/s
    assert meter.rate() == pytest.approx(1.0, rel=0.05)
    assert format_eta(3725) == "1:02:05" and format_eta(None) == "?"


def test_tensorboard_log_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from jobs.telemetry.progress import JobView
    from jobs.telemetry.tensorboard import TensorBoardLog, check_tensorboard

    check_tensorboard(str(tmp_path))
    log = TensorBoardLog(str(tmp_path), "part0000-host-1")
    for step in (2, 4, 6):
        log.add(step, step / 2, {"hits": step, "misses": 1, "mode": "eager", "captures": 0, "entries": []},
                JobView(total=10, done=step, rate=1.0, workers=1))
    log.close()
    acc = EventAccumulator(str(tmp_path / "part0000-host-1"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"throughput/images_per_s", "job/done_items", "job/eta_s", "graph/hits", "graph/misses",
            "graph/captures"} <= tags
    assert [(e.step, e.value) for e in acc.Scalars("graph/hits")] == [(2, 2.0), (4, 4.0), (6, 6.0)]
    assert [e.value for e in acc.Scalars("job/eta_s")] == [8.0, 6.0, 4.0]


def test_tensorboard_missing_is_a_user_error(monkeypatch):
    from jobs.telemetry.tensorboard import check_tensorboard

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(UserError, match=r"job.tensorboard='/tmp/tb' needs the tensorboard package.*\[tensorboard\]"):
        check_tensorboard("/tmp/tb")
    check_tensorboard(None)  # not asked for: nothing needed
