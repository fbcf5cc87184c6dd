"""A stand-in for the Ray actor (jobs/cluster/actor.py) for tests of the driver's pool: the real
call surface over the real UnitFeed, with a unit that takes `unit_s` and a chosen misbehaviour."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Optional

import ray

from jobs.cluster.feed import UnitFeed
from jobs.plan.units import UnitInfo


class StandIn:
    def __init__(self, unit_s: float = 0.05, raise_on: Optional[int] = None, die_once_on: Optional[int] = None,
                 marker: Optional[str] = None, done_dir: Optional[str] = None):
        self.unit_s, self.raise_on, self.die_once_on, self.marker = unit_s, raise_on, die_once_on, marker
        self.done_dir = Path(done_dir) if done_dir else None  # a done marker per unit, as the real actor writes
        self.feed = UnitFeed()
        self.done: list = []
        self.started = self.asked = None
        self.halted: Optional[str] = None

    def where(self) -> str:
        return f"pid {os.getpid()}"

    def run(self) -> dict:
        self.started = time.time()
        try:
            while True:
                # Stamped before the ask: asking is what publishes the pick (warm() returns) and lets the
                # pool start the others, while the unit itself may come after they started.
                self.asked = self.asked or time.time()
                info = self.feed.next_unit(None)
                if info is None:
                    break
                if self.done_dir and (self.done_dir / str(info.id)).exists():  # finished by a process that died
                    self.done.append(info.id)  # before its call returned: done, as the real actor's scan finds
                    self.feed.release(info.id)
                    continue
                if info.id == self.raise_on:
                    raise RuntimeError(f"boom in unit {info.id}")
                if info.id == self.die_once_on and not Path(self.marker).exists():
                    Path(self.marker).write_text("died")
                    os._exit(1)  # a process death, as an OOM kill is
                time.sleep(self.unit_s)
                if self.halted:  # a stop: the unit is left unfinished
                    break
                if self.done_dir:
                    (self.done_dir / str(info.id)).open("x").close()  # exclusive: a unit generated twice raises
                self.done.append(info.id)
                self.feed.release(info.id)
        finally:
            self.feed.release_all()
        return {"done": self.done, "started": self.started, "asked": self.asked, "halted": self.halted}

    def generate(self, info: UnitInfo) -> dict:
        if self.feed.give(info):
            self.feed.wait(info.id)
        return {"unit": info.id, "done": info.id in self.done, "written": info.count if info.id in self.done else 0}

    def warm(self) -> bool:
        self.feed.asked.wait()
        return True

    def progress(self) -> dict:
        return {}

    def end(self) -> None:
        self.feed.close()

    def halt(self, reason: str) -> None:
        self.halted = reason
        self.feed.close()


class RunOutlivesItsProcess(StandIn):
    """A StandIn whose process death only its unit calls report, deterministically.

    In a real job every call of a dead actor fails, in an order Ray does not promise; the pool
    once lost a unit in one of them: a unit's call seen failed before run()'s. Here the actor is
    created with Ray's own max_restarts=1 and its run() and progress() calls are retried on the
    restarted process, unit calls not (max_task_retries 0): when the process dies, RayActorError
    reaches the driver through unit calls only. The restarted process does nothing (run() waits
    there until the pool's ray.kill; a unit call re-sent to it waits too): it stands for a dead
    actor's run() whose failure has not reached the driver yet."""

    @ray.method(max_task_retries=-1)
    def run(self) -> dict:
        if ray.get_runtime_context().was_current_actor_reconstructed:
            threading.Event().wait()
        return super().run()

    @ray.method(max_task_retries=-1)
    def progress(self) -> dict:
        return {}
