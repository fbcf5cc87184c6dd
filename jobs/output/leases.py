"""The lease file: a worker's exclusive, expiring claim on one work unit, as a file on the shared filesystem.

    _plan/leases/unit-NNNNNNN.lease     published by a hard link (fails if the name exists): one winner
    content: owner, host, pid, process start time, ttl     heartbeat: the file's mtime (futimes)

    _plan/workers/HOST-PID.lease        a worker's hold on the run itself, the same format (unit -1):
                                        from its join of the plan to its end, whether it holds a unit or not

A unit's lease covers the time a worker generates that unit; the worker's hold covers the rest of its
life in the run (loading its model, sizing batches, waiting between units, writing the index), when
a wipe of the folder (job.overwrite) would pull the run out from under it just the same.

This is the format and how to read it (who holds what, is it expired), which the claim's wipe
and the planner need as much as a worker; taking, beating and breaking leases and holds is the
worker's (jobs/worker/lease.py, jobs/worker/presence.py).

A lease whose holder ran on this host and whose process is gone (SIGKILL, OOM kill) counts as
expired at once: waiting for the ttl would only delay a restart on the same node.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from jobs.output.layout import LEASE_DIR, WORKER_DIR, unit_name


def process_start_time(pid: int) -> Optional[int]:
    """Linux process start time (clock ticks since boot), to tell a pid from its reuse; None for
    a process that is gone, including a zombie (dead, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    try:
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (IndexError, ValueError):
        return None


HOST = socket.gethostname()


@dataclass(frozen=True)
class LeaseInfo:
    unit: int
    owner: str
    host: str
    pid: int
    start_time: Optional[int]
    ttl_s: float
    heartbeat: float  # mtime of the lease file
    ino: int

    def age(self, now: Optional[float] = None) -> float:
        return (time.time() if now is None else now) - self.heartbeat

    def holder_dead_here(self) -> bool:
        """The holder ran on this host and its process is gone (or is another process now)."""
        if self.host != HOST:
            return False
        return process_start_time(self.pid) != self.start_time or self.start_time is None and not pid_alive(self.pid)

    def expired(self, now: Optional[float] = None) -> bool:
        return self.age(now) > self.ttl_s or self.holder_dead_here()

    def describe(self) -> str:
        where = f"pid {self.pid} on {self.host}, heartbeat {self.age():.0f}s ago"
        if self.unit < 0:  # a worker's hold on the run (holder_path), not a unit's lease
            return f"worker {self.owner} ({where})"
        return f"unit {self.unit} held by {self.owner} ({where})"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_path(plan_dir: Path, unit: int) -> Path:
    return plan_dir / LEASE_DIR / f"{unit_name(unit)}.lease"


def read_lease(path: Path) -> Optional[LeaseInfo]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        return None
    except ValueError:
        # Leases are written whole before they are linked in (jobs/worker/lease.py), so one that does not parse
        # is damaged, not half written. Its holder, if alive, still touches it: judged by its mtime and the
        # default TTL it expires like any other (it never did, and a rerun waited for it forever). Breaking a
        # live holder's lease is the takeover the lease guard handles: that holder stops writing the unit.
        return LeaseInfo(unit=_unit_of(path), owner=f"a damaged lease file ({path})", host="?", pid=-1,
                         start_time=None, ttl_s=DAMAGED_LEASE_TTL_S, heartbeat=st.st_mtime, ino=st.st_ino)
    return LeaseInfo(unit=data.get("unit", -1), owner=data.get("owner", "?"), host=data.get("host", "?"),
                     pid=int(data.get("pid", -1)), start_time=data.get("start_time"),
                     ttl_s=float(data.get("ttl_s", 0)), heartbeat=st.st_mtime, ino=st.st_ino)


DAMAGED_LEASE_TTL_S = 600.0  # job.lease_ttl_s's default: a damaged lease's own TTL cannot be read


def _unit_of(path: Path) -> int:
    """The unit a lease file names (unit-0000042.lease), or -1 (a worker's hold: HOST-PID.lease)."""
    digits = path.stem.partition("-")[2] if path.stem.startswith("unit-") else ""
    return int(digits) if digits.isdigit() else -1


def live_leases(plan_dir: Path) -> List[LeaseInfo]:
    return _live(plan_dir / LEASE_DIR, "unit-*.lease")


def holder_path(plan_dir: Path, host: str, pid: int) -> Path:
    """A worker process's hold on the run: `_plan/workers/HOST-PID.lease`."""
    return plan_dir / WORKER_DIR / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}-{pid}.lease"


def live_holders(plan_dir: Path) -> List[LeaseInfo]:
    """The workers in the run now: heard from within their ttl, and not a process of this host that is gone."""
    return _live(plan_dir / WORKER_DIR, "*.lease")


def _live(d: Path, glob: str) -> List[LeaseInfo]:
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob(glob)):
        info = read_lease(p)
        if info is not None and not info.expired():
            out.append(info)
    return out
