"""Python's garbage-collection pauses in a process, for bench_job_wall.py --gc (issue 28).

The job's steady batch is GPU-bound, yet at 1,000 prompts (1024²) its generate stage spent 9.4 s in
intervals above the steady pace (benchmarks/results/job_wall_h200_1024_1000_s37.md). That sum counts
only the intervals above the median. The net, the intervals' sum less as many steady ones
(bench_job_wall.batch_pace's `excess_s`), was at most 2.0 s there (279.4 s of stage, less the first
hand-off at 5.3 s, less 125 intervals of 2.177 s): about the three signature switches. So the rest was
jitter that the faster intervals gave back, not stalls. The thread that submits graph replays stays only a
few replays ahead of the GPU, so a pause of that thread longer than those replays would leave the GPU
idle; a full collection over the objects torch, transformers and diffusers load is one such pause. This
records each collection of the process it is imported in:

    BENCH_GC_FILE=PATH python benchmarks/probed.py -m jobs.generate [overrides...]

with BENCH_GC_FILE naming the JSON written at exit: [[unix start, generation, seconds], ...].
`summarize` reads it against a window (the job's generate stage, one slow interval).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import time
from pathlib import Path

_PAUSES: list = []
_STARTED: dict = {}


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _STARTED["unix"], _STARTED["t"] = time.time(), time.perf_counter()
    elif "t" in _STARTED:
        seconds = round(time.perf_counter() - _STARTED["t"], 5)
        _PAUSES.append([round(_STARTED["unix"], 4), info.get("generation"), seconds])


def _write(path: Path) -> None:
    path.write_text(json.dumps(_PAUSES))


def install(path: Path) -> None:
    """Record every collection from now on; write them to path at exit."""
    gc.callbacks.append(_callback)
    atexit.register(_write, Path(path))


def install_from_env() -> None:
    """install() to $BENCH_GC_FILE, if set (benchmarks/probed.py)."""
    if os.environ.get("BENCH_GC_FILE"):
        install(Path(os.environ["BENCH_GC_FILE"]))


def summarize(pauses: list, start: float = float("-inf"), end: float = float("inf")) -> dict:
    """Collections that began in [start, end) (unix seconds): count and seconds per generation, the longest."""
    inside = [p for p in pauses if start <= p[0] < end]
    by_gen: dict = {}
    for _, gen, s in inside:
        n, total = by_gen.get(str(gen), (0, 0.0))
        by_gen[str(gen)] = (n + 1, total + s)
    return {"collections": {g: n for g, (n, _) in sorted(by_gen.items())},
            "seconds": {g: round(t, 3) for g, (_, t) in sorted(by_gen.items())},
            "longest_s": round(max((s for *_, s in inside), default=0.0), 4)}
