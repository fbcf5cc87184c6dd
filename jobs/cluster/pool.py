"""The actor pool and the loop that keeps it fed: Ray Core calls on long-lived actors.

    spawn        one actor per worker slot (num_gpus / num_cpus from ray.*); run() on each
    feed         each running actor holds its unit plus one queued (AHEAD), so it never waits for
                 the driver between units; the next unit is chosen when it is handed out (warm
                 signature first, jobs/cluster/queue.py) and leased by the driver (grants.py)
    wait         ray.wait over every outstanding call: a unit's call returns when its done marker
                 is written; a dead actor fails every call it had (RayActorError)
    death        its units go back to the queue, first in line; the slot gets a new actor, at
                 most ray.max_restarts times; the unit's next holder scans what the dead one
                 committed (per-unit shard names, manifests, the done marker last) and continues
    crash        an actor that raised (not died) stops the job: the others halt between batches
                 and commit, and the error is raised on the driver (a rerun resumes)

Batch sizes: a pool grown by measurement (bcg.batch_grow) changes bytes, so it is measured once
per output_dir and published in _plan/batching.json. Actors on different nodes do not share that
file's folder, so while it is not published yet one actor runs first; the others start once it
asked for its first unit (its pick is published, and uploaded with an object store).

Why Ray Core and not Ray Data's map_batches over an actor pool: a unit's output is side effects
(its shards, committed and uploaded by the actor), not rows to return; the order of units (warm
signature first) and exactly-once on an actor's death are ours to decide, and Ray Data would retry
a failed block on its own terms. Here the unit is the task, the call's result its outcome.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.exceptions import RayActorError, RayTaskError

from jobs.cluster.grants import Grants
from jobs.cluster.progress import DriverProgress
from jobs.cluster.queue import UnitQueue
from jobs.errors import UserError
from jobs.plan import Signature
from jobs.plan.units import UnitInfo
from jobs.worker.stop import StopFlag

log = logging.getLogger("jobs.cluster")

AHEAD = 1  # units queued in an actor behind the one it generates
PROGRESS_S = 5.0  # how often the driver asks each actor for its open units' counts
RETRY_ELSEWHERE_S = 30.0  # how often units leased by another job are tried again


@dataclass(eq=False)  # compared and hashed by identity: slots live in sets
class Slot:
    """A worker slot and its current actor (an incarnation: a new one after each death)."""

    index: int
    part: int  # this incarnation's number over the job (its summary and timeline name)
    actor: Any
    restarts: int = 0
    started: bool = False  # run() called
    finished: bool = False  # run() returned
    dead: bool = False
    last: Optional[Signature] = None
    holding: int = 0  # units handed out, not yet released
    units_done: int = 0
    written: int = 0
    progress_pending: bool = False


@dataclass
class PoolResult:
    records: List[dict] = field(default_factory=list)  # JobStats of every actor whose run() returned
    actors: List[dict] = field(default_factory=list)  # every incarnation: part, slot, status, units, items
    redone: List[int] = field(default_factory=list)  # units handed out again after their actor died
    halted: Optional[str] = None  # why the job stopped early (a signal), if it did


class WorkerFailed(RuntimeError):
    """An actor's run() raised: the job stops (the cause is raised from the driver)."""

    def __init__(self, slot: Slot, error: RayTaskError):
        super().__init__(f"worker {slot.index} (part {slot.part}) failed: {error.cause!r}")
        self.slot, self.error = slot, error


class Pool:
    def __init__(self, spawn: Callable[[int], Any], slots: int, queue: UnitQueue, grants: Grants,
                 progress: DriverProgress, max_restarts: int, sized: bool, wait_for_leases: bool,
                 result: Optional[PoolResult] = None):
        self.spawn, self.queue, self.grants, self.progress = spawn, queue, grants, progress
        self.max_restarts, self.sized, self.wait_for_leases = max_restarts, sized, wait_for_leases
        self.result = result if result is not None else PoolResult()
        self._parts = 0
        self._calls: Dict[Any, tuple] = {}  # ObjectRef -> (kind, slot, unit or None)
        self._last_progress = 0.0
        self._last_retry = time.monotonic()
        self._ending = False  # draining: no new actors, no new units
        # Per completion the loop touches only the slots it must: O(1) bookkeeping, not O(actors).
        self._hungry: set = set()  # running slots that may take another unit
        self._holding = 0  # units handed out and not released, over all slots
        self.slots = [self._new_slot(i) for i in range(slots)]

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self, stop: StopFlag) -> PoolResult:
        self._start_ready()
        try:
            while not self._finished():
                if stop.reason:
                    self.result.halted = stop.reason
                    break
                self._feed_all()
                self._wait_once()
        except (WorkerFailed, KeyboardInterrupt) as e:
            self._stop_all("interrupted" if isinstance(e, KeyboardInterrupt) else "a worker failed")
            raise
        except BaseException:
            self._stop_all("the driver failed")
            raise
        if self.result.halted:
            self._stop_all(self.result.halted)
        else:
            self._end_all()
        return self.result

    def _finished(self) -> bool:
        if self._holding:
            return False
        if len(self.queue):
            if not any(not s.dead and not s.finished for s in self.slots):
                raise RuntimeError(f"every worker died or ended with {len(self.queue)} unit(s) left "
                                   f"(ray.max_restarts={self.max_restarts} per worker; see the deaths above). "
                                   f"Committed shards are kept: rerun the same command to resume.")
            return False
        if self.grants.elsewhere and self.wait_for_leases:
            return False  # units another job holds: wait for them, as a leasing worker would
        return True

    def _new_slot(self, index: int, restarts: int = 0) -> Slot:
        slot = Slot(index=index, part=self._parts, actor=self.spawn(self._parts), restarts=restarts)
        self._parts += 1
        return slot

    def _start(self, slot: Slot) -> None:
        slot.started = True
        self._hungry.add(slot)
        self._call(slot.actor.run.remote(), "run", slot)
        if not self.sized:
            self._call(slot.actor.warm.remote(), "warm", slot)

    def _start_ready(self) -> None:
        """run() on every slot once the batch sizes are published; before, on one slot only."""
        if self._ending:
            return
        live = [s for s in self.slots if not s.dead and not s.started]
        if self.sized:
            for slot in live:
                self._start(slot)
        elif live and not any(s.started and not s.dead and not s.finished for s in self.slots):
            log.info("batch sizes not published yet: worker %d measures them first, the others start after it",
                     live[0].index)
            self._start(live[0])

    # -- feeding -----------------------------------------------------------------------------
    def _feed_all(self) -> None:
        now = time.monotonic()
        if self.grants.elsewhere and now - self._last_retry >= RETRY_ELSEWHERE_S:
            self._last_retry = now
            for back in self.grants.retry_elsewhere():
                self._put_back(back)
        for slot in list(self._hungry):
            if not len(self.queue):
                break
            while not (slot.dead or slot.finished) and slot.holding <= AHEAD:
                info = self._next_unit(slot.last)
                if info is None:
                    break
                self._call(slot.actor.generate.remote(info), "unit", slot, info)
                slot.holding += 1
                self._holding += 1
                slot.last = info.signature
            if slot.dead or slot.finished or slot.holding > AHEAD:
                self._hungry.discard(slot)
        if now - self._last_progress >= PROGRESS_S:
            self._last_progress = now
            for slot in self.slots:
                if slot.started and not (slot.dead or slot.finished or slot.progress_pending):
                    slot.progress_pending = True
                    self._call(slot.actor.progress.remote(), "progress", slot)

    def _put_back(self, info: UnitInfo) -> None:
        self.queue.put_back(info)
        self._hungry.update(s for s in self.slots if s.started and not (s.dead or s.finished))

    def _next_unit(self, warm: Optional[Signature]) -> Optional[UnitInfo]:
        while True:
            info = self.queue.take(warm)
            if info is None or self.grants.take(info):
                return info

    # -- waiting -----------------------------------------------------------------------------
    def _call(self, ref, kind: str, slot: Slot, unit: Optional[UnitInfo] = None) -> None:
        self._calls[ref] = (kind, slot, unit)

    def _wait_once(self) -> None:
        refs = list(self._calls)
        if not refs:
            time.sleep(1.0)  # nothing in flight: units held by another job, retried every RETRY_ELSEWHERE_S
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=PROGRESS_S)
        if ready:  # everything that is ready now, in one call
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in self._calls:  # a death handled earlier in this batch dropped the slot's calls
                self._handle(ref)

    def _handle(self, ref) -> None:
        kind, slot, unit = self._calls.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError as e:
            # the call just popped is one of the dead actor's too: its unit goes back with the others
            self._died(slot, e, [unit] if kind == "unit" and unit is not None else [])
            return
        except RayTaskError as e:
            if isinstance(e.cause, UserError):  # bad input only that node could see (a model path)
                raise UserError(f"worker {slot.index} ({self._where(slot)}): {e.cause}") from None
            raise WorkerFailed(slot, e) from e
        if kind == "unit":
            self._unit_returned(slot, unit, value)
        elif kind == "run":
            slot.finished = True
            self._hungry.discard(slot)
            self.result.records.append(value)
            self._record(slot, "finished")
        elif kind == "warm":
            if not self.sized:
                self.sized = True
                self._start_ready()
        else:
            slot.progress_pending = False
            self.progress.report(slot.part, value)

    def _unit_returned(self, slot: Slot, unit: UnitInfo, report: dict) -> None:
        slot.holding -= 1
        self._holding -= 1
        self._hungry.add(slot)
        if report["done"]:
            self.grants.release(unit.id)
            slot.units_done += 1
            slot.written += report["written"]
            self.progress.unit_done(slot.part, unit.id, unit.count)
        else:  # the actor stopped before finishing it: still ours, next in line
            self._put_back(unit)

    def _died(self, slot: Slot, error: RayActorError, popped: List[UnitInfo]) -> None:
        units = popped + [u for ref, (kind, s, u) in list(self._calls.items()) if s is slot and kind == "unit"]
        for ref in [r for r, (_, s, _u) in self._calls.items() if s is slot]:
            del self._calls[ref]
        if slot.finished:  # it returned its stats and held nothing: its end is not a death of the job's
            return
        self._holding -= slot.holding
        slot.dead, slot.holding = True, 0
        self._hungry.discard(slot)
        # Unavailable (not known dead: a lost connection) must not leave a live writer of the units
        # we hand on: make Ray end it, wherever it is, before they go to another actor.
        ray.kill(slot.actor)
        self.progress.forget(slot.part)
        for info in units:
            self._put_back(info)
            self.result.redone.append(info.id)
        self._record(slot, "died")
        log.warning("worker %d (part %d) died (%s); its unit(s) %s go to the other workers", slot.index, slot.part,
                    _first_line(error), [u.id for u in units] or "none")
        if self._ending or (not len(self.queue) and not units):
            return
        if slot.restarts < self.max_restarts:
            new = self._new_slot(slot.index, slot.restarts + 1)
            self.slots[self.slots.index(slot)] = new
            log.info("worker slot %d: starting a new actor (part %d, restart %d of %d)", slot.index, new.part,
                     new.restarts, self.max_restarts)
        else:
            log.warning("worker slot %d is not restarted again (ray.max_restarts=%d)", slot.index, self.max_restarts)
        self._start_ready()  # the new actor, or another one if the dead one was measuring batch sizes

    def _record(self, slot: Slot, status: str) -> None:
        self.result.actors.append({"part": slot.part, "slot": slot.index, "status": status,
                                   "units_done": slot.units_done, "items_written": slot.written})

    def _where(self, slot: Slot) -> str:
        try:
            return ray.get(slot.actor.where.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - only for the message
            return f"part {slot.part}"

    # -- ending ------------------------------------------------------------------------------
    def _end_all(self) -> None:
        self._ending = True
        for slot in self.slots:
            if slot.dead or slot.finished:
                continue
            if slot.started:
                slot.actor.end.remote()
            else:
                ray.kill(slot.actor)  # gated behind batch sizing, and the job ended first
                slot.dead = True
        self._drain()

    def _stop_all(self, reason: str) -> None:
        """Every running actor stops between batches and commits; units it did not finish go back."""
        self._ending = True
        live = [s for s in self.slots if s.started and not (s.dead or s.finished)]
        for slot in self.slots:
            if not slot.started and not slot.dead:
                ray.kill(slot.actor)
                slot.dead = True
        if live:
            log.warning("stopping %d worker(s) (%s): each finishes its batch and commits", len(live), reason)
        for slot in live:
            slot.actor.halt.remote(reason)
        try:
            self._drain()
        except (WorkerFailed, UserError) as e:
            log.error("while stopping: %s", e)

    def _drain(self) -> None:
        """Until every actor's run() and every unit's call has returned (or its actor died): a
        stopping actor releases the units it holds, and they go back to the queue."""
        while any(kind in ("run", "unit") for kind, _, _ in self._calls.values()):
            self._wait_once()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
