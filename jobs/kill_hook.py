"""TEST HOOK, not a feature: make a job kill itself at a chosen instant (the kill tests).

`BCGEN_TEST_KILL_AT=plan | load | batch:N | shard-write:N | upload:N` names the instant; unset, each
hook costs one environment lookup. It lives apart from every room so the planner, the worker and
the object-store mirror can all call it without importing each other.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

KILL_AT_ENV = "BCGEN_TEST_KILL_AT"
KILL_SIGNAL_ENV = "BCGEN_TEST_KILL_SIGNAL"


def kill_hook(point: str, count: int = 0, output_dir: Optional[Path] = None) -> None:
    """TEST HOOK, not a feature: BCGEN_TEST_KILL_AT=plan | load | batch:N | shard-write:N | upload:N makes
    the job signal itself (BCGEN_TEST_KILL_SIGNAL, default KILL) during planning, as its model starts
    loading (it has joined the plan and holds no unit yet), after the first
    item of batch N is handed to the sink, while a shard is open after N shards were committed, or
    (an object-store output_dir) once shard N's tar and sidecars are uploaded but not its manifest,
    so the kill tests hit those instants deterministically. Unset, it costs one environment lookup."""
    spec = os.environ.get(KILL_AT_ENV)
    if not spec or spec.partition(":")[0] != point:
        return
    n = int(spec.partition(":")[2] or 0)
    if point in ("batch", "upload") and count != n:
        return
    if point == "shard-write":
        if count < n:
            return
        if output_dir is None:  # its one caller (jobs/worker/handoff.py) always passes the folder
            raise TypeError("kill_hook('shard-write') needs output_dir, the folder its open shards are in")
        if not any(output_dir.glob(".shard-*.tar*.tmp")):
            return
    sig = signal.Signals[f"SIG{os.environ.get(KILL_SIGNAL_ENV, 'KILL')}"]
    log.warning("test hook %s=%s: sending %s to this process", KILL_AT_ENV, spec, sig.name)
    os.kill(os.getpid(), sig)
