"""Leases, the worker's side: take a unit's lease, keep it alive, break an expired one, release it.

The file and how to read it are jobs/output/leases.py; `_plan/leases/unit-NNNNNNN.lease` is
published by a hard link (fails if the name exists: one winner), its heartbeat is its mtime.

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

A unit's lease is released (unlinked) after its done marker is written (jobs/output/done.py), or
when the worker stops without finishing it (SIGTERM, error), so a rerun takes it at once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, Optional

from jobs.errors import EnvironmentFailure
from jobs.output.layout import LEASE_DIR
from jobs.output.leases import HOST, LeaseInfo, lease_path, process_start_time, read_lease
from sinks.errors import CommitRefused

log = logging.getLogger(__name__)


class LeaseLost(EnvironmentFailure, CommitRefused):
    """This worker's lease on a unit was taken over (it stalled past job.lease_ttl_s): it commits
    nothing more of the unit, whose new holder finishes it, and stops."""


class Lease:
    """A held lease: an open fd on the lease file we created, and the token of this taking."""

    def __init__(self, plan_dir: Path, unit: int, fd: int, path: Path, token: str = ""):
        self.plan_dir, self.unit, self.fd, self.path, self.token = plan_dir, unit, fd, path, token
        self.ino = os.fstat(fd).st_ino
        self.taken = time.time()

    @property
    def temp_tag(self) -> str:
        """Host, pid and this taking of the lease: the temp names of whatever this lease writes, so a
        stale holder and its successor never share (or delete) each other's temp files."""
        return re.sub(r"[^A-Za-z0-9_-]", "_", f"{HOST}-{os.getpid()}-{self.token}")

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

    def __init__(self, plan_dir: Path, owner: str, ttl_s: float, staging=None):
        self.plan_dir, self.owner, self.ttl_s = plan_dir, owner, ttl_s
        # An object store's claim of this staging folder (jobs/output/staging_claim.py), or None: once
        # another folder took the run over, this worker's leases are worth nothing either.
        self.staging = staging
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
        token = uuid.uuid4().hex[:8]
        body = {"unit": unit, "owner": self.owner, "host": HOST, "pid": os.getpid(), "token": token,
                "start_time": process_start_time(os.getpid()), "ttl_s": self.ttl_s, "taken": time.time()}
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
        lease = Lease(self.plan_dir, unit, fd, path, token)
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
        why = ("its process is gone" if info.holder_dead_here()
               else f"no heartbeat for {info.age():.0f}s > {info.ttl_s:g}s")
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

    def check(self, unit: int) -> None:
        """Raise LeaseLost unless this worker still holds the unit (a guard before each commit)."""
        if self.staging is not None and self.staging.lost:
            self.lost.add(unit)
            raise LeaseLost(self.staging.lost)
        if self.still_held(unit):
            return
        self.lost.add(unit)
        lease = self.held.get(unit)
        held_for = f" after {time.time() - lease.taken:.0f}s" if lease is not None else ""
        raise LeaseLost(f"lost the lease on unit {unit}{held_for}: another worker took it over as expired (no "
                        f"heartbeat from this process for more than job.lease_ttl_s={self.ttl_s:g}s: was it stopped "
                        f"or starved?). This worker stops and commits nothing more of it; its new holder finishes "
                        f"it. Rerun the same command to join the run again")

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
                        log.warning("lost the lease on unit %d (taken over as expired): this worker stops "
                                    "writing it", lease.unit)
                except OSError as e:
                    log.warning("heartbeat of unit %d failed: %s", lease.unit, e)
