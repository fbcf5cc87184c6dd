"""The wait before a job's first batch, from the moment the kernel started its process.

A user times the whole command, and before the plan and the load there is Python's own start,
the imports of Hydra and torch, Hydra's compose and the checks: about a quarter of a SANA-1.6B
job's 19 s to its first batch on the H200 (`benchmarks/results/job_wall_h200_512_invariant_s48.md`),
and no stage of the summary counted it. The front door marks where each of these parts ends; the
worker reads them into summary.json's `startup_seconds` and `first_batch_s`.

    process start ─ interpreter ─▶ cli() ─ compose ─▶ typed config ─ worker_imports ─▶ run_job
        ─ checks ─▶ the plan stage

interpreter: Python's own start and the front door's imports (Hydra, omegaconf, the config schema);
compose: the command-line check, Hydra's compose (its logging and run folder) and the typed config;
worker_imports: torch and the worker's modules; checks: the device, the process group, the config,
the model source and the output folder's claim. A Ray driver (jobs/cluster/driver.py) has one part
more, connect: Ray's start or its join of the cluster, and the output folder's claim.

A Ray job's first batch comes from an actor, a process Ray started on some node: the driver hands its
own start to each actor as a unix time (`started_at`), and the actor times its first batch from it
(`arm_at`), so `first_batch_s` is what the user waited for, on the driver's clock. Two nodes' clocks
agree to NTP's precision, a few milliseconds; an actor whose clock runs far behind reports none.

Only a process whose own front door ran (`arm`, from `jobs.generate.cli`) reports, and only for its
first job: a test or a notebook that calls the worker in a process started long before has no
start-up to speak of, and neither has a Hydra sweep's second job, run in the process of the first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, Optional

STARTUP_PART_ORDER = ("interpreter", "compose", "worker_imports", "checks", "connect")

_marks: Dict[str, float] = {}  # part -> time.perf_counter() when it ended
_started: Optional[float] = None  # time.perf_counter() at the process's start, once armed


def process_age_s() -> Optional[float]:
    """Seconds since the kernel started this process, to its clock tick (10 ms); None without Linux's /proc.

    /proc/self/stat's field 22 is the start time in clock ticks after boot, on the clock
    CLOCK_BOOTTIME reads (time namespaces shift both alike)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        after_name = stat.rsplit(")", 1)[1].split()  # the command's name may hold spaces and ")"
        ticks = int(after_name[19])  # field 22 of proc(5): the 20th after the name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if age >= 0 else None


def mark(part: str) -> None:
    """`part` of the start-up ends now (the first call for a part counts: a second run in one process
    has no start-up of its own)."""
    _marks.setdefault(part, time.perf_counter())


def job_begins() -> None:
    """The worker starts a job: the process's first ends the `worker_imports` part here; a later one (the
    next job of a sweep, in the same process) has no start-up of its own and no first batch timed from
    the process's start, so the clock is put away."""
    global _started
    if "worker_imports" in _marks:
        _started = None
    else:
        mark("worker_imports")


def arm() -> None:
    """This process is a job's own: its start-up, from the kernel's start of it, is reported."""
    global _started
    age = process_age_s()
    now = time.perf_counter()
    if age is not None:
        _started = now - age
    elif _marks:  # no /proc: from the first mark, whose own part is then unknown
        first = min(_marks, key=_marks.__getitem__)
        _started = _marks.pop(first)


def started_at() -> Optional[float]:
    """The process's start as a unix time, for another process (a Ray actor) to time from; None when
    this process was not armed."""
    return None if _started is None else time.time() - (time.perf_counter() - _started)


def arm_at(unix_start: float) -> None:
    """Time this process's first batch from another process's start (`started_at` there), not its own:
    a Ray actor's, from its driver's. This process's own start-up is not reported (no marks are read)."""
    global _started
    _started = time.perf_counter() - (time.time() - unix_start)


def seconds() -> Dict[str, float]:
    """The parts marked so far, each from the end of the one before (the first from the process's start),
    in the order they ran; {} when this process was not armed."""
    if _started is None:
        return {}
    out, previous = {}, _started
    for part, ended in sorted(_marks.items(), key=lambda kv: kv[1]):
        out[part] = round(max(ended - previous, 0.0), 3)
        previous = ended
    return out


def since_start() -> Optional[float]:
    """Seconds from the process's start to now; None when this process was not armed, or when it was armed
    from another node's clock that runs ahead of this one's by more than the wait."""
    if _started is None:
        return None
    since = time.perf_counter() - _started
    return round(since, 3) if since >= 0 else None
