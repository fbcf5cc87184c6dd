"""The driver's bar: the whole job's done items, rate and ETA, over every actor.

    done = items of units done (at start, and each unit an actor reports done)
           + items of the actors' open units committed or on their way (polled every few seconds)
    rate = items/s over the last two minutes (jobs/telemetry/progress.py RateMeter)
    ETA  = (planned items - done) / rate

Nothing travels through output_dir: the actors may be on nodes that share no filesystem with the
driver. A dead actor's open unit stops counting until another actor commits it.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Dict

from jobs.telemetry.progress import JobView, RateMeter, format_eta

log = logging.getLogger("jobs.cluster")


class DriverProgress:
    def __init__(self, total: int, done: int, bar: bool, log_every_s: float):
        self.total, self.done, self.log_every_s = total, done, log_every_s
        self.meter = RateMeter()
        self._open: Dict[int, Dict[int, int]] = {}  # part -> unit -> items
        self._peak = self._now_done()  # the rate counts new items only, not a dead actor's redone ones
        self._last_log = time.monotonic()
        self._bar = None
        if bar and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=self._peak, unit="img", dynamic_ncols=True, smoothing=0.1)

    def unit_done(self, part: int, unit: int, items: int) -> None:
        self.done += items
        self._open.get(part, {}).pop(unit, None)
        self._update()

    def report(self, part: int, inflight: Dict[int, int]) -> None:
        self._open[part] = dict(inflight)
        self._update()

    def forget(self, part: int) -> None:
        self._open.pop(part, None)

    def view(self) -> JobView:
        return JobView(total=self.total, done=min(self._now_done(), self.total), rate=self.meter.rate(),
                       workers=len(self._open))

    def _now_done(self) -> int:
        return self.done + sum(n for units in self._open.values() for n in units.values())

    def _update(self) -> None:
        now = self._now_done()
        if now > self._peak:
            self.meter.add(now - self._peak)
            self._peak = now
        view = self.view()
        if self._bar is not None:
            self._bar.n = view.done
            self._bar.set_postfix_str(f"{view.workers} worker(s), ETA {format_eta(view.eta_s)}", refresh=False)
            self._bar.refresh()
        if time.monotonic() - self._last_log >= self.log_every_s:
            self._last_log = time.monotonic()
            log.info("progress: %s", view.line())

    def close(self) -> None:
        log.info("progress: %s", self.view().line())
        if self._bar is not None:
            self._bar.close()
