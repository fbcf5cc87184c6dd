"""A worker's hold on the run it joined: `_plan/workers/HOST-PID.lease`, kept alive from its join of the
plan to its end (the format: jobs/output/leases.py).

A unit's lease covers only the unit being generated. Before its first unit (loading the model, which
takes minutes for a real one, sizing batches), between units and while it writes the index, a worker
holds no lease, yet a `job.overwrite=true` that wiped the folder then would leave it failing with a
traceback, or writing into the new run's folder. The wipe refuses while any hold is live
(jobs/output/claim.py refuse_while_held).

Why these choices:
- Taken under the plan lock, right after the join (jobs/plan/publish.py's `on_joined`): an overwrite
  checks holds under the same lock, so it sees every worker that joined before it, and a worker that
  joins after it joins the new run (or is refused, if its config is the old run's).
- One file per process (its name is the host and pid), written whole under a temp name, then renamed.
- Heartbeat: the open descriptor's mtime, every ttl/4, from a daemon thread, as a lease's: a SIGKILLed
  worker stops beating and counts as gone after the ttl, or at once on its own host (dead pid).
- Holds of workers that are gone are removed when a worker takes its own, so `_plan/workers/` holds the
  live ones and a few of the dead at most.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional

from jobs.output.layout import WORKER_DIR
from jobs.output.leases import HOST, holder_path, process_start_time, read_lease

log = logging.getLogger(__name__)


class Presence:
    """This process's hold on the run in `plan_dir`: `take()` once it has joined, `release()` at its end."""

    def __init__(self, plan_dir: Path, owner: str, ttl_s: float):
        self.plan_dir, self.owner, self.ttl_s = plan_dir, owner, ttl_s
        self.path = holder_path(plan_dir, HOST, os.getpid())
        self.fd = -1
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def taken(self) -> bool:
        return self.fd >= 0

    def take(self) -> None:
        """Publish the hold and start its heartbeat (again after a release: a sweep's next job)."""
        if self.taken:
            return
        self.path.parent.mkdir(exist_ok=True)
        _remove_gone(self.plan_dir)
        body = {"unit": -1, "owner": self.owner, "host": HOST, "pid": os.getpid(),
                "start_time": process_start_time(os.getpid()), "ttl_s": self.ttl_s, "taken": time.time()}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(json.dumps(body).encode())
        os.replace(tmp, self.path)
        self.fd = os.open(self.path, os.O_RDONLY)
        self._stop.clear()
        # daemon: a crashing worker simply stops beating, and its hold expires
        self._thread = threading.Thread(target=self._beat, name="worker-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if not self.taken:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:  # ours still (not wiped and replaced)
                self.path.unlink()
        except FileNotFoundError:
            pass  # the run's folder was wiped after this worker was judged gone (stopped past its ttl)
        os.close(self.fd)
        self.fd = -1

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                os.utime(self.fd)
            except OSError as e:
                log.warning("heartbeat of this worker's hold on %s failed: %s", self.path, e)


def _remove_gone(plan_dir: Path) -> None:
    """The holds of workers that are gone (killed, or silent past their ttl): they hold nothing."""
    for path in sorted((plan_dir / WORKER_DIR).glob("*.lease")):
        info = read_lease(path)
        if info is None or not info.expired():
            continue
        try:
            if os.stat(path).st_ino == info.ino:  # not a hold taken since by a new process with that pid
                path.unlink()
        except FileNotFoundError:
            pass  # another worker removed it first
