"""Leases: a worker's exclusive, expiring claim on one work unit, as a file on the shared filesystem.

    _plan/leases/unit-NNNNNNN.lease     published by a hard link (fails if the name exists): one winner
    content: owner, host, pid, process start time, ttl     heartbeat: the file's mtime (futimes)

Why these choices:
- link() (like an O_EXCL create) is atomic on local filesystems and NFS/Lustre/GPFS, where flock
  may be absent; the lease's content is written before the link, so it is never seen empty.
- The heartbeat touches the holder's *open file descriptor*, not the path: if the lease was taken
  over meanwhile (renamed away as expired), the touch lands on the old inode and can never revive
  or overwrite the new holder's lease. The holder checks ownership by inode (`held()`).
- An expired lease is broken by renaming it to a unique tombstone (one renamer wins) and checking
  that the inode moved is the one judged expired; a fresh lease moved by mistake is put back.
- A lease whose holder ran on this host and whose process is gone (SIGKILL, OOM kill) is broken at
  once: waiting for the ttl would only delay a restart on the same node.

A unit's lease is released (unlinked) after its done marker is written (jobs/worker/done.py), or
when the worker stops without finishing it (SIGTERM, error), so a rerun takes it at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

log = logging.getLogger(__name__)

LEASE_DIR = "leases"


def _start_time(pid: int) -> Optional[int]:
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
        return _start_time(self.pid) != self.start_time or self.start_time is None and not pid_alive(self.pid)

    def expired(self, now: Optional[float] = None) -> bool:
        return self.age(now) > self.ttl_s or self.holder_dead_here()

    def describe(self) -> str:
        return f"unit {self.unit} held by {self.owner} (pid {self.pid} on {self.host}, heartbeat {self.age():.0f}s ago)"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_path(plan_dir: Path, unit: int) -> Path:
    from jobs.plan.units import unit_name

    return plan_dir / LEASE_DIR / f"{unit_name(unit)}.lease"


def read_lease(path: Path) -> Optional[LeaseInfo]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        return None
    except ValueError:  # unreadable: treat as fresh rather than break a lease we cannot read
        return LeaseInfo(unit=-1, owner="?", host="?", pid=-1, start_time=None, ttl_s=float("inf"),
                         heartbeat=time.time(), ino=-1)
    return LeaseInfo(unit=data.get("unit", -1), owner=data.get("owner", "?"), host=data.get("host", "?"),
                     pid=int(data.get("pid", -1)), start_time=data.get("start_time"),
                     ttl_s=float(data.get("ttl_s", 0)), heartbeat=st.st_mtime, ino=st.st_ino)


def live_leases(plan_dir: Path) -> List[LeaseInfo]:
    d = plan_dir / LEASE_DIR
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("unit-*.lease")):
        info = read_lease(p)
        if info is not None and not info.expired():
            out.append(info)
    return out


class Lease:
    """A held lease: an open fd on the lease file we created."""

    def __init__(self, plan_dir: Path, unit: int, fd: int, path: Path):
        self.plan_dir, self.unit, self.fd, self.path = plan_dir, unit, fd, path
        self.ino = os.fstat(fd).st_ino

    def touch(self) -> None:
        os.utime(self.fd)

    def held(self) -> bool:
        """Our inode is still the one under the lease's name (nobody broke it)."""
        try:
            return os.stat(self.path).st_ino == self.ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self.fd < 0:
            return
        if self.held():
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = -1


class Leaser:
    """Takes leases for this worker and keeps them alive with a heartbeat thread."""

    def __init__(self, plan_dir: Path, owner: str, ttl_s: float):
        self.plan_dir, self.owner, self.ttl_s = plan_dir, owner, ttl_s
        (plan_dir / LEASE_DIR).mkdir(exist_ok=True)
        self.held: Dict[int, Lease] = {}
        self.lost: set = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def try_take(self, unit: int) -> Optional[Lease]:
        """The unit's lease, or None when another worker holds a live one. Breaks expired ones."""
        path = lease_path(self.plan_dir, unit)
        for _ in range(3):
            lease = self._create(path, unit)
            if lease is not None:
                return lease
            info = read_lease(path)
            if info is None:
                continue  # released between our create and our read: try again
            if not info.expired():
                return None
            if not self._break(path, info):
                return None
        return None

    def _create(self, path: Path, unit: int) -> Optional[Lease]:
        # Written under a temp name, then hard-linked to the lease's name: the link fails if the
        # name exists (exclusive, like O_EXCL, on NFS too), and no reader ever sees an empty lease.
        body = {"unit": unit, "owner": self.owner, "host": HOST, "pid": os.getpid(),
                "start_time": _start_time(os.getpid()), "ttl_s": self.ttl_s, "taken": time.time()}
        tmp = path.with_name(f".{path.name}.{HOST}-{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(body).encode())
            os.fsync(fd)
            os.link(tmp, path)
        except FileExistsError:
            os.close(fd)
            return None
        finally:
            tmp.unlink(missing_ok=True)
        lease = Lease(self.plan_dir, unit, fd, path)
        with self._lock:
            self.held[unit] = lease
        self._start_heartbeat()
        return lease

    def _break(self, path: Path, info: LeaseInfo) -> bool:
        tomb = path.with_name(f".{path.name}.expired-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, tomb)
        except FileNotFoundError:
            return True  # someone else broke or released it: try to create
        if os.stat(tomb).st_ino != info.ino:  # we moved a lease created after our read: put it back
            try:
                os.link(tomb, path)
            except FileExistsError:
                pass  # a third worker created one meanwhile; the moved lease's holder sees it lost
            os.unlink(tomb)
            return False
        os.unlink(tomb)
        why = "its process is gone" if info.holder_dead_here() else f"no heartbeat for {info.age():.0f}s > {info.ttl_s:g}s"
        log.warning("taking over unit %d from %s (pid %d on %s): %s", info.unit, info.owner, info.pid, info.host, why)
        return True

    def release(self, unit: int) -> None:
        with self._lock:
            lease = self.held.pop(unit, None)
        if lease is not None:
            lease.release()

    def release_all(self) -> None:
        for unit in list(self.held):
            self.release(unit)
        self._stop.set()

    def still_held(self, unit: int) -> bool:
        lease = self.held.get(unit)
        return lease is not None and unit not in self.lost and lease.held()

    # -- heartbeat -------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        if self._thread is None:
            # daemon: a SIGKILLed or crashing worker simply stops beating and its leases expire.
            self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with self._lock:
                leases = list(self.held.values())
            for lease in leases:
                try:
                    if lease.fd >= 0:
                        lease.touch()
                    if not lease.held() and lease.unit not in self.lost:
                        self.lost.add(lease.unit)
                        log.error("lost the lease on unit %d (taken over as expired): this worker stops "
                                  "writing it", lease.unit)
                except OSError as e:
                    log.warning("heartbeat of unit %d failed: %s", lease.unit, e)
