"""One staging folder at a time per object-store output_dir: a marker in the bucket per live worker.

Leases live in the staging folder (an object store has no atomic create), so workers share units
only when they share one staging folder. Two machines with their default staging folders, or two
`job.staging_dir`s, would each lease every unit of their own copy of the plan and generate
everything twice. So every worker process of an object-store run keeps a marker in the bucket:

    _staging/<staging id>-<host>-<pid>.json     staging id and folder, host, pid, ttl, started
        written when the worker starts; rewritten every job.lease_ttl_s/4 (its LastModified, on the
        store's clock, is the heartbeat); deleted when the worker ends

The staging id is made once inside the staging folder (`staging-id.json`, published with a hard
link): every worker that mounts one folder (torchrun ranks, array tasks on NFS) reads the same id,
whatever its host or mount path, and two folders never share one, even at the same path on two
machines. A marker is live while it was heard from within its ttl, unless it is a process of this
host that is gone (as for leases, jobs/output/leases.py).

Joining: write our marker, then list the markers. A live marker of another staging folder that
started no later than ours refuses this job, naming both folders and the fix; a newer one is left
to refuse itself. Exclusive because each writes before it lists and the store lists what was
written (S3 is read-after-write consistent): of two folders the later always sees the earlier.
Store times are whole seconds, so two that start in the same second may both be refused, never
both admitted. A worker frozen past its ttl (SIGSTOP) may have been judged gone meanwhile: its
next heartbeat lists again, and if another folder is live it stops at its next commit.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from jobs.errors import UserError
from jobs.output.claim import publish_once
from jobs.output.layout import STAGING_ID_FILE, STAGING_MARKER_DIR
from jobs.output.leases import HOST, process_start_time
from sinks.remote import Remote

log = logging.getLogger(__name__)

ID_CHARS = 16


def staging_id(folder: Path) -> str:
    """The staging folder's id, made on first use; the same for every worker that mounts the folder."""
    path = folder / STAGING_ID_FILE
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            value = json.loads(path.read_bytes())["id"]
        except FileNotFoundError:
            publish_once(path, json.dumps({"id": uuid.uuid4().hex[:ID_CHARS]}).encode())  # one creator wins
            continue
        except (ValueError, KeyError, TypeError):
            value = None
        if not isinstance(value, str) or not re.fullmatch(f"[0-9a-f]{{{ID_CHARS}}}", value):
            raise UserError(f"{path} is damaged (not this folder's id); while no worker uses the staging folder "
                            f"{folder}, delete the file and rerun (the folder then gets a new id)")
        return value
    raise AssertionError(f"{path} was created and vanished while reading it")


@dataclass(frozen=True)
class Marker:
    """A worker's marker as listed: its name, its body, and when the store last heard from it."""

    name: str
    body: dict
    heard: float  # the object's LastModified, epoch seconds on the store's clock

    @property
    def staging_id(self) -> str:
        return self.name[len(STAGING_MARKER_DIR) + 1:][:ID_CHARS]

    @property
    def started(self) -> float:
        """When its worker first wrote it, on the store's clock (the first write's LastModified,
        carried in the body of later ones)."""
        return float(self.body.get("started") or self.heard)

    def gone_here(self) -> bool:
        return self.body.get("host") == HOST and process_start_time(int(self.body.get("pid", -1))) != \
            self.body.get("start_time")

    def live(self, now: float) -> bool:
        return now - self.heard <= float(self.body.get("ttl_s", 0)) and not self.gone_here()

    def describe(self, now: float) -> str:
        b = self.body
        return (f"{b.get('staging', '?')} on host {b.get('host', '?')} (pid {b.get('pid', '?')}, heard from "
                f"{max(0.0, now - self.heard):.0f}s ago)")


class StagingClaim:
    """This worker's marker: joined (or refused) once, kept alive by a heartbeat thread, released at the end."""

    def __init__(self, remote: Remote, staging: Path, url: str, ttl_s: float):
        self.remote, self.staging, self.url, self.ttl_s = remote, Path(staging), url, ttl_s
        self.id = staging_id(self.staging)
        self.name = f"{STAGING_MARKER_DIR}/{self.id}-{re.sub(r'[^A-Za-z0-9_.-]', '_', HOST)}-{os.getpid()}.json"
        self.started: Optional[float] = None
        self.lost = ""  # why this worker must stop committing: another staging folder took over
        self._last = 0.0  # time.monotonic() of the last heartbeat written
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- joining -----------------------------------------------------------------------------
    def join(self) -> "StagingClaim":
        """Write our marker, then refuse (UserError, marker removed) while another folder is live."""
        self._write()
        markers = self._markers()
        now = markers[self.name].heard if self.name in markers else time.time()
        self.started = now
        blocking = self._blocking(markers, now)
        if blocking:
            self._remove()
            raise UserError(self._refusal(blocking, now))
        self._write()  # with `started`: later heartbeats keep it
        self._thread = threading.Thread(target=self._beat_loop, name="staging-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _markers(self) -> Dict[str, Marker]:
        """Every marker in the bucket; bodies are read only when another folder has one (else none is needed)."""
        heard = self.remote.modified(STAGING_MARKER_DIR, "*.json")
        prefix = f"{STAGING_MARKER_DIR}/{self.id}"
        if all(name.startswith(prefix) for name in heard):
            return {n: Marker(n, self._body() if n == self.name else {}, t) for n, t in heard.items()}
        return {n: Marker(n, self._read(n), t) for n, t in heard.items()}

    def _read(self, name: str) -> dict:
        try:
            data = self.remote.read_bytes(name)
            return json.loads(data) if data else {}
        except ValueError:
            return {}  # not a marker this tool wrote: counts as gone (ttl 0)

    def _blocking(self, markers: Dict[str, Marker], now: float) -> List[Marker]:
        """Live markers of other folders that started no later than this folder did, oldest first."""
        others = [m for m in markers.values() if m.staging_id != self.id]
        self._tidy([m for m in others if not m.live(now)])
        ours = [m.started for m in markers.values() if m.staging_id == self.id and m.name != self.name and m.live(now)]
        ours_started = min([self.started or now, *ours])
        return sorted((m for m in others if m.live(now) and m.started <= ours_started), key=lambda m: m.started)

    def _tidy(self, gone: List[Marker]) -> None:
        """Markers of workers killed without a chance to remove theirs: removed, so the folder stays small."""
        try:
            self.remote.rm([m.name for m in gone])
        except Exception as e:  # noqa: BLE001 - tidying is best effort; a marker left over only expires again
            log.debug("could not remove expired staging markers: %s", e)

    def _refusal(self, blocking: List[Marker], now: float) -> str:
        shown = "; ".join(m.describe(now) for m in blocking[:3]) + (
            f"; and {len(blocking) - 3} more" if len(blocking) > 3 else "")
        tie = " (it started in the same second as this job: rerun one of the two)" \
            if blocking[0].started >= (self.started or now) else ""
        return (f"output_dir={self.url!r} is being generated right now from another staging folder: {shown}{tie}. "
                f"This job's staging folder is {self.staging} on host {HOST}. Workers share units only through "
                f"the lease files of one staging folder, so both would generate every unit. Give every worker "
                f"the same job.staging_dir, on a folder they all mount (NFS, Lustre), or run one Ray job "
                f"(+cluster=ray), whose driver hands out the units; or wait for that job to end (a worker killed "
                f"without removing its marker stops counting job.lease_ttl_s={self.ttl_s:g}s after its last "
                f"heartbeat)")

    # -- heartbeat ---------------------------------------------------------------------------
    def _body(self) -> dict:
        return {"staging_id": self.id, "staging": str(self.staging), "output_dir": self.url, "host": HOST,
                "pid": os.getpid(), "start_time": process_start_time(os.getpid()), "ttl_s": self.ttl_s,
                "started": self.started}

    def _write(self) -> None:
        self.remote.put_bytes(self.name, json.dumps(self._body()).encode())
        self._last = time.monotonic()

    def beat(self) -> None:
        """Rewrite our marker. After a silence longer than the ttl (a frozen process), list again: a
        folder that started meanwhile, judging us gone, has the run now."""
        silent = time.monotonic() - self._last
        self._write()
        if silent <= self.ttl_s or self.lost:
            return
        markers = self._markers()
        now = markers[self.name].heard if self.name in markers else time.time()
        others = [m for m in markers.values() if m.staging_id != self.id and m.live(now)]
        if others:
            self.lost = (f"lost the claim on output_dir={self.url!r}: this worker was silent for {silent:.0f}s, more "
                         f"than job.lease_ttl_s={self.ttl_s:g}s (stopped or starved?), and another staging folder "
                         f"took the run over meanwhile: {others[0].describe(now)}. This worker commits nothing more "
                         f"and stops; rerun there, or once that job has ended")
            log.error("%s", self.lost)

    def _beat_loop(self) -> None:
        # daemon: a SIGKILLed worker simply stops beating, and its marker expires
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001 - a failed heartbeat is retried; a long silence is caught above
                log.warning("heartbeat of %s on %s failed: %s", self.name, self.url, e)

    def release(self) -> None:
        """Stop beating and remove our marker (a job on another staging folder may then start at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._remove()

    def _remove(self) -> None:
        try:
            self.remote.rm([self.name])
        except Exception as e:  # noqa: BLE001 - left behind, it expires after its ttl
            log.warning("could not remove %s from %s (%s): it expires in %gs", self.name, self.url, e, self.ttl_s)
