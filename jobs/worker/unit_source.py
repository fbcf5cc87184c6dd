"""Which unit a worker generates next: the seam between the generation loop and what coordinates workers.

    UnitSource        next_unit(last signature) -> a unit this worker now owns, or None: no more
                      still_held(unit), check(unit) (raises LeaseLost), temp_tag(unit), lost,
                      release(unit), release_all()
    LeaseSource       lease files on a filesystem every worker mounts (HPC: torchrun, Slurm, by hand)
    jobs/cluster/     a Ray driver hands units to its actors (UnitFeed); no shared filesystem needed

The loop (jobs/worker/loop.py) and the sink (jobs/worker/unit_sink.py) see only this protocol: a
unit is released once its done marker is written (or when the worker stops without finishing it),
and a unit in `lost` was taken over by another worker, so this one stops writing it.

LeaseSource's order of units: the signature this worker has warm first (its graphs stay captured),
then the costliest (longest-processing-time-first balances the tail), rotated by the worker's part
so workers started together try different units first. When no unit is free but others hold some,
it waits (job.wait_for_leases) and takes over any whose lease expires: a dead worker's unit is
finished by a live one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import List, Optional, Protocol, Set

from jobs.output.done import done_units
from jobs.output.layout import PLAN_FILE
from jobs.output.leases import live_leases
from jobs.plan import Signature
from jobs.plan.units import PlanManifest, UnitInfo
from jobs.worker.lease import Leaser
from jobs.worker.stop import StopFlag

log = logging.getLogger("jobs.run")


class UnitSource(Protocol):
    @property
    def lost(self) -> Set[int]:
        """Units taken over by another worker: stop writing them, never mark them done. Read-only
        here: LeaseSource forwards its leaser's set, UnitFeed (jobs/cluster/feed.py) holds its own."""

    def next_unit(self, last: Optional[Signature]) -> Optional[UnitInfo]:
        """The next unit this worker owns (blocks while none is free yet); None when none is left.
        `last`: the signature of the unit just generated (its graphs are warm)."""

    def still_held(self, unit: int) -> bool: ...

    def check(self, unit: int) -> None:
        """Raise LeaseLost unless this worker still owns `unit` (the guard before each commit)."""

    def temp_tag(self, unit: int) -> str:
        """What this worker's temp names of `unit` carry, so a stale owner and its successor never
        share (or delete) each other's temp files."""

    def release(self, unit: int) -> None: ...

    def release_all(self) -> None: ...


class LeaseSource:
    """Units taken by lease files (jobs/worker/lease.py), in the order of the module docstring."""

    def __init__(self, manifest: PlanManifest, plan_dir: Path, leaser: Leaser, part: int, wait: bool,
                 stop: Optional[StopFlag] = None):
        self.plan_dir, self.leaser, self.wait, self.stop = plan_dir, leaser, wait, stop
        done = done_units(plan_dir)
        order = sorted((u for u in manifest.units if u.id not in done), key=lambda u: (-u.cost, u.id))
        k = part % len(order) if order else 0
        self._order: List[UnitInfo] = order[k:] + order[:k]
        self._plan_stat = self._stat()

    @property
    def lost(self) -> Set[int]:
        return self.leaser.lost

    def still_held(self, unit: int) -> bool:
        return self.leaser.still_held(unit)

    def check(self, unit: int) -> None:
        self.leaser.check(unit)

    def temp_tag(self, unit: int) -> str:
        return self.leaser.held[unit].temp_tag

    def release(self, unit: int) -> None:
        self.leaser.release(unit)

    def release_all(self) -> None:
        self.leaser.release_all()

    def _stat(self) -> tuple:
        st = (self.plan_dir / PLAN_FILE).stat()
        return st.st_ino, st.st_mtime_ns

    def _check_plan_unchanged(self) -> None:
        """A job.overwrite by another job replaces the plan while this worker waits between units
        (it holds no lease then, so the overwrite is allowed): stop rather than generate the new
        plan's units with this worker's old config."""
        try:
            same = self._stat() == self._plan_stat
        except FileNotFoundError:
            same = False
        if not same:
            raise RuntimeError(f"the plan in {self.plan_dir} was replaced or removed while this worker ran "
                               f"(job.overwrite=true by another job?); this worker stops. "
                               f"Rerun it to join the new run.")

    def next_unit(self, last: Optional[Signature]) -> Optional[UnitInfo]:
        waited = False
        while self.stop is None or not self.stop.reason:
            done = done_units(self.plan_dir)
            left = [u for u in self._order if u.id not in done and u.id not in self.leaser.held]
            if not left:
                return None
            warm = [u for u in left if u.signature == last]
            for info in warm + [u for u in left if u.signature != last]:
                if self.leaser.try_take(info.id) is None:
                    continue
                self._check_plan_unchanged()
                if info.id in done_units(self.plan_dir):  # finished between our listing and our lease
                    self.leaser.release(info.id)
                    continue
                return info
            if not self.wait:
                log.info("%d unit(s) left, all leased by other workers; exiting (job.wait_for_leases=false)", len(left))
                return None
            if not waited:
                holders = live_leases(self.plan_dir)
                log.info("%d unit(s) left, leased by other workers (%s); waiting for them or their expiry",
                         len(left), "; ".join(h.describe() for h in holders[:3]))
                waited = True
            time.sleep(min(self.leaser.ttl_s / 4, 5.0))
        return None
