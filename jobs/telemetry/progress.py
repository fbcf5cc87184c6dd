"""The whole job's progress, across every worker that shares the plan: done items, rate, ETA.

Workers share nothing but output_dir (torchrun ranks, array tasks, jobs started by hand), so the
counts travel through it, cheaply:

    _plan/done/unit-*.json         items of done units (each marker read once, then cached)
    _progress/WORKER.json          each worker, every few seconds: items written in its units not yet
                                   done (by unit), its recent items/s, when it wrote that

    done = items of done units + items of the workers' open units that are not done yet
    rate = the sum of the recent rates of the workers heard from lately
    ETA  = (planned items - done) / rate

A worker removes its file when it ends; a killed worker's file stops counting once it is older
than a few of its own publishing intervals. Items a killed worker committed in a unit it did not
finish are counted when the unit's next holder marks it done.

The bar (`Progress`): the counts of the other workers come through output_dir, so it shows the
job, not this process: with 8 ranks and 4 array tasks, each node's bar (local rank 0) shows the
same done/total and ETA. tqdm draws it on a terminal, with one count, one rate and one ETA, all
in items and all the job's (tqdm's own rate and remaining time would be this process's, from
the bar's jumps); while it is up, log lines are routed around it (tqdm.contrib.logging), so none
prints into the bar. Between two views of the job it moves with this worker's own items, and it
closes on the final count. A plain log line every `log_every_s` keeps non-interactive logs
(Slurm, CI) informative. With `job.tensorboard`, the same numbers and the
graph runner's counters go to TensorBoard.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

from jobs.output.layout import DONE_DIR, PROGRESS_DIR

log = logging.getLogger("jobs.telemetry.progress")

PUBLISH_S = 2.0  # a worker writes its file at most this often
RATE_WINDOW_S = 120.0  # items/s over this much recent time


@dataclass(frozen=True)
class JobView:
    total: int
    done: int
    rate: float
    """Items/s of every worker heard from lately, together."""
    workers: int

    @property
    def eta_s(self) -> Optional[float]:
        if self.rate <= 0:
            return None
        return max(self.total - self.done, 0) / self.rate

    def line(self) -> str:
        eta = self.eta_s
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"job {self.done}/{self.total} items ({pct:.1f}%), {self.rate:.2f} items/s over {self.workers} "
                f"worker(s), ETA {format_eta(eta)}")


def format_eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class RateMeter:
    """Items/s over the last RATE_WINDOW_S seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.count = 0
        self._samples: deque = deque([(clock(), 0)])

    def add(self, n: int) -> None:
        self.count += n
        now = self.clock()
        self._samples.append((now, self.count))
        while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_S:
            self._samples.popleft()

    def rate(self) -> float:
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


class SharedProgress:
    """Publishes this worker's counts and reads everyone's (see the module docstring)."""

    def __init__(self, output_dir: Path, plan_dir: Path, worker: str, total: int,
                 inflight: Callable[[], Dict[int, int]], clock: Callable[[], float] = time.time):
        self.dir = Path(output_dir) / PROGRESS_DIR
        self.done_dir = Path(plan_dir) / DONE_DIR
        self.worker, self.total, self.inflight, self.clock = worker, total, inflight, clock
        self.path = self.dir / f"{_safe(worker)}.json"
        self.meter = RateMeter()
        self._published = 0.0
        self._interval = PUBLISH_S
        self._last_batch = self.clock()
        self._markers: Dict[str, int] = {}  # done marker name -> its items (a marker never changes)

    def add(self, n: int) -> None:
        now = self.clock()
        # A worker whose batches take longer than PUBLISH_S publishes once a batch: others wait that long.
        self._interval = max(PUBLISH_S, 0.8 * self._interval + 0.2 * (now - self._last_batch))
        self._last_batch = now
        self.meter.add(n)
        if now - self._published >= PUBLISH_S:
            self.publish()

    def publish(self) -> None:
        from sinks.atomic import temp_path_for

        now = self.clock()
        doc = {"worker": self.worker, "time": now, "every_s": round(self._interval, 3),
               "rate": round(self.meter.rate(), 6), "inflight": {str(u): n for u, n in self.inflight().items()}}
        self.dir.mkdir(exist_ok=True)
        tmp = temp_path_for(self.path)
        tmp.write_text(json.dumps(doc))  # telemetry: atomic (rename), not durable (no fsync)
        os.replace(tmp, self.path)
        self._published = now

    def close(self) -> None:
        self.path.unlink(missing_ok=True)

    def view(self) -> JobView:
        """The whole job now: one listing of _plan/done/ and _progress/, new markers read once."""
        done_units = set()
        names = os.listdir(self.done_dir) if self.done_dir.is_dir() else []
        for name in names:
            if not (name.startswith("unit-") and name.endswith(".json")):
                continue
            done_units.add(int(name[5:12]))
            if name not in self._markers:
                try:
                    self._markers[name] = int(json.loads((self.done_dir / name).read_text())["items"])
                except (OSError, ValueError, KeyError):
                    continue  # being replaced right now: read it next time
        done = sum(self._markers.get(n, 0) for n in names)
        rate, workers, now = 0.0, 0, self.clock()
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if path == self.path:
                doc["rate"] = self.meter.rate()  # our own, fresher than the file
                doc["inflight"] = {str(u): n for u, n in self.inflight().items()}
            elif now - doc["time"] > 3 * doc["every_s"] + 10:
                continue  # not heard from lately: killed, or hung
            workers += 1
            rate += doc["rate"]
            done += sum(n for u, n in doc["inflight"].items() if int(u) not in done_units)
        if not self.path.exists():  # before the first publish
            workers += 1
            rate += self.meter.rate()
            done += sum(n for u, n in self.inflight().items() if u not in done_units)
        return JobView(total=self.total, done=min(done, self.total), rate=rate, workers=workers)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# -- the bar: this worker's view of the job ------------------------------------------------
VIEW_EVERY_S = 5.0  # the job's view costs a listing of _plan/done/ and _progress/: not every batch


UNIT = "items"  # the one unit of the bar and the log lines: an item is an image or a video
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} " + UNIT + "{postfix}"  # no tqdm rate, no tqdm ETA


class Progress:
    def __init__(self, shared: SharedProgress, bar: bool, log_every_s: float, job_view: bool = True,
                 tensorboard=None, stream=None):
        self.shared, self.log_every_s, self.job_view = shared, log_every_s, job_view
        self.tensorboard = tensorboard
        self.done = 0  # by this worker
        self.t0 = self._last_log = time.perf_counter()
        self._last_view = 0.0
        self.view: Optional[JobView] = shared.view() if job_view else None
        self._done_at_view = 0  # this worker's count when `view` was taken
        self._bar = None
        self._redirect = None
        stream = sys.stderr if stream is None else stream
        if bar and job_view and stream.isatty():
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            assert self.view is not None  # job_view: taken above
            self._bar = tqdm(total=self.view.total, initial=self.view.done, dynamic_ncols=True, file=stream,
                             bar_format=BAR_FORMAT)
            # Console log handlers write through tqdm while the bar is up: a line, then the bar again.
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()

    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.t0, 1e-9)

    def update(self, n: int, signature: str, graph: dict) -> None:
        self.done += n
        self.shared.add(n)
        now = time.perf_counter()
        log_now = now - self._last_log >= self.log_every_s
        if self.job_view and (log_now or now - self._last_view >= VIEW_EVERY_S):
            self.view = self.shared.view()
            self._last_view, self._done_at_view = now, self.done
        status = f"{signature} hits {graph.get('hits', 0)} misses {graph.get('misses', 0)}"
        if self._bar is not None:
            assert self.view is not None  # the bar is only up with the job's view (job_view)
            self._draw(f"{self.view.workers} worker(s), {status}")
        if self.tensorboard is not None:
            self.tensorboard.add(self.shared.meter.count, self.shared.meter.rate(), graph, self.view)
        if log_now:
            self._last_log = now
            job = f"; {self.view.line()}" if self.view is not None else ""
            log.info("progress: this worker %d items, %.2f items/s, %s%s", self.done, self.rate(), status, job)

    def _draw(self, status: str) -> None:
        v, bar = self.view, self._bar
        assert v is not None and bar is not None  # drawn only while the bar, and so the job's view, is up
        # The job's count as last seen, plus what this worker did since (the view is read every few s).
        bar.n = min(v.total, v.done + self.done - self._done_at_view)
        bar.set_postfix_str(f"{v.rate:.2f} {UNIT}/s, ETA {format_eta(v.eta_s)}, {status}", refresh=False)
        bar.refresh()

    def close(self) -> None:
        try:
            if self._bar is not None:
                # The final count: the units this worker finished last are marked done by now.
                self.view, self._done_at_view = self.shared.view(), self.done
                self._draw(f"{self.view.workers} worker(s)")
                self._bar.close()
        finally:
            if self._redirect is not None:
                self._redirect.__exit__(None, None, None)
            self.shared.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
