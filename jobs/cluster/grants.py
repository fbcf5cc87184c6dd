"""The driver's hold on the units it hands out: a lease file per unit, as any worker takes.

The driver, not lease files, decides which actor generates what; but it takes each unit's lease
(jobs/worker/lease.py) in its own output folder (output_dir, or the staging folder of an object
store) before handing it out, and releases it once the unit's done marker is written. That keeps
today's guarantees between jobs: a second driver, or a torchrun/Slurm worker, on the same local
output_dir skips the units this one holds (and it skips theirs); job.overwrite is refused while
it holds any. A unit whose actor died stays leased by the driver while it goes to another actor.

Leases are held by an open descriptor each (the heartbeat touches it): a driver of 1,000 actors
holds up to 2,000, past the common soft limit of 1,024 descriptors, hence `raise_fd_limit`.
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path
from typing import List, Optional

from jobs.output.done import done_path
from jobs.output.layout import PLAN_FILE
from jobs.plan.units import UnitInfo
from jobs.worker.lease import Leaser

log = logging.getLogger("jobs.cluster")


class Grants:
    def __init__(self, plan_dir: Path, owner: str, ttl_s: float):
        self.plan_dir = plan_dir
        self.leaser = Leaser(plan_dir, owner, ttl_s)
        self.elsewhere: List[UnitInfo] = []  # leased by another job when we tried: tried again later
        self.done_elsewhere = 0  # items of units another job finished while this one ran
        self._plan_stat = self._stat()

    def _stat(self) -> tuple:
        st = (self.plan_dir / PLAN_FILE).stat()
        return st.st_ino, st.st_mtime_ns

    def take(self, info: UnitInfo) -> bool:
        """Lease `info` for the driver; False when another job holds it or has finished it."""
        if info.id in self.leaser.held:  # a unit coming back from a dead actor: still ours
            return True
        if self.leaser.try_take(info.id) is None:
            self.elsewhere.append(info)
            return False
        if self._stat() != self._plan_stat:
            raise RuntimeError(f"the plan in {self.plan_dir} was replaced while this driver ran (job.overwrite=true "
                               f"by another job?); the driver stops. Rerun it to join the new run.")
        if done_path(self.plan_dir, info.id).exists():  # finished by another job before our lease
            self.leaser.release(info.id)
            self.done_elsewhere += info.count
            return False
        return True

    def retry_elsewhere(self) -> List[UnitInfo]:
        """The units other jobs held, to try again (once their leases are released or expire)."""
        units, self.elsewhere = self.elsewhere, []
        return [u for u in units if not self._finished(u)]

    def _finished(self, info: UnitInfo) -> bool:
        if done_path(self.plan_dir, info.id).exists():
            self.done_elsewhere += info.count
            return True
        return False

    def release(self, unit: int) -> None:
        self.leaser.release(unit)

    def release_all(self) -> None:
        self.leaser.release_all()


def raise_fd_limit(needed: int) -> Optional[int]:
    """Raise the soft descriptor limit to `needed` (at most the hard limit); returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    log.info("open-file limit raised from %d to %d: the driver holds a lease descriptor per unit in flight", soft, new)
    return new
