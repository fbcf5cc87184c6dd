"""`UnitFeed`: the UnitSource of a Ray actor (jobs/worker/unit_source.py), fed by the driver.

    driver ── actor.generate(unit) ──▶ give(unit) ──▶ queue ──▶ next_unit() ◀── the generation loop
                  (a Ray call that      wait(unit) ◀── release(unit) ◀── UnitSink: done marker written
                   returns when the                                        (or the worker stopped)
                   unit is released)

The driver pushes a unit and its Ray call blocks until the unit is released, so the call's result
is the unit's outcome and a dead actor shows as an error on exactly the calls of the units it
held. The loop asks for the next unit only after committing the previous one.

Nothing is ever `lost`: the driver hands a unit to another actor only once this one is dead.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from typing import Dict, Optional, Set

from jobs.output.leases import HOST
from jobs.plan import Signature
from jobs.plan.units import UnitInfo
from jobs.worker.lease import LeaseLost


class UnitFeed:
    def __init__(self):
        self._queue: "queue.Queue[Optional[UnitInfo]]" = queue.Queue()
        self._lock = threading.Lock()
        self._released: Dict[int, threading.Event] = {}
        self._held: Set[int] = set()
        self._closed = False
        self.lost: Set[int] = set()
        self.asked = threading.Event()  # the loop asked for its first unit: model loaded, batch sizes published

    # -- the driver's side (Ray calls, each on its own thread of the actor) ----------------------
    def give(self, info: UnitInfo) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._released[info.id] = threading.Event()
        self._queue.put(info)
        return True

    def wait(self, unit: int) -> None:
        """Block until `unit` is released (done, or given up by a worker that stops)."""
        self._released[unit].wait()
        with self._lock:
            self._released.pop(unit, None)

    def close(self) -> None:
        """No more units: the loop ends once it asks again. Units given but not started are dropped
        (released unfinished), so a stop does not begin a new unit."""
        with self._lock:
            self._closed = True
        while True:
            try:
                info = self._queue.get_nowait()
            except queue.Empty:
                break
            if info is not None:
                self._set(info.id)
        self._queue.put(None)

    # -- the loop's side (UnitSource) ---------------------------------------------------------
    def next_unit(self, last: Optional[Signature]) -> Optional[UnitInfo]:
        self.asked.set()
        info = self._queue.get()  # the driver chose the order (warm signature first)
        if info is None:
            self._queue.put(None)  # closed for good: any later ask ends too
            return None
        self._held.add(info.id)
        return info

    def still_held(self, unit: int) -> bool:
        return unit in self._held

    def check(self, unit: int) -> None:
        # The driver never takes a unit back from a live actor (module docstring): held until released.
        if unit not in self._held:
            raise LeaseLost(f"unit {unit} is not this actor's (released, or never given): it commits nothing "
                            f"more of it")

    def temp_tag(self, unit: int) -> str:
        """This process and the unit: an actor that took a dead one's unit writes other temp names."""
        return re.sub(r"[^A-Za-z0-9_-]", "_", f"{HOST}-{os.getpid()}-u{unit}")

    def release(self, unit: int) -> None:
        self._held.discard(unit)
        self._set(unit)

    def release_all(self) -> None:
        """The worker ends (finished, stopped or failed): every waiting call returns."""
        self.close()
        self.asked.set()
        for unit in list(self._held):
            self.release(unit)
        with self._lock:
            waiting = list(self._released)
        for unit in waiting:
            self._set(unit)

    def _set(self, unit: int) -> None:
        with self._lock:
            event = self._released.get(unit)
        if event is not None:
            event.set()
