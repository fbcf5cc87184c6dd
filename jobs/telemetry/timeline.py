"""The per-batch timeline: one JSON line per finished batch, `output_dir/_timeline/PART.jsonl`.

    {"t": 3.21, "start": 1796000000.5, "run": "9f2c...", "part": "shard", "items": 4,
     "signature": "64x64 ...", "mode": "replay", "batch_size": 4, "captures": 1, "releases": 0,
     "evictions": 0}

`t` is seconds since this process's generate stage started, `start` that moment (unix time) so
parts and resumed runs can be laid on one clock, `run` a digest of run.json, so lines left by an
older run can be told apart (an object store's remote copy, say: `job.overwrite=true` removes the
local folder with the rest of the run). Counters are the runner's cumulative ones, null without a
runner. Each part writes its own file (named like its writer lock), so ranks never share one.

It is telemetry, not output: lines are buffered and flushed every FLUSH_S seconds and at close,
so a SIGKILL may lose the last few seconds of lines, and a torn last line is skipped on reading.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

from jobs.output.claim import run_id
from jobs.output.layout import RUN_FILE, TIMELINE_DIR

log = logging.getLogger(__name__)

FLUSH_S = 2.0


@dataclass(frozen=True)
class BatchEntry:
    t: float
    """Seconds from the start of the generate stage to the batch's hand-off to the sink."""
    start: float
    """Unix time the generate stage started (this part, this run)."""
    run: str
    """Digest of the run.json the batch was generated under ("" when there was none)."""
    part: str
    items: int
    signature: str
    mode: str
    """replay, eager or mixed (jobs/worker/pipeline.py BatchResult.mode)."""
    batch_size: int
    captures: Optional[int] = None
    releases: Optional[int] = None
    evictions: Optional[int] = None


def run_digest(output_dir: Path) -> str:
    """The run id of jobs/output/claim.py (what the run's manifests carry), "" without a run.json."""
    return run_id(Path(output_dir)) if (Path(output_dir) / RUN_FILE).is_file() else ""


class Timeline:
    """Appends BatchEntry lines for one part; `start()` when the generate stage begins."""

    def __init__(self, output_dir: Path, part: str):
        self.part = part
        self.run = run_digest(output_dir)
        folder = Path(output_dir) / TIMELINE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run continues the same file; its lines carry their own `start`.
        self._file = open(folder / f"{part}.jsonl", "a", encoding="utf-8", buffering=1 << 16)
        self._t0 = time.monotonic()
        self._start = time.time()
        self._flushed = self._t0

    def start(self) -> None:
        self._t0, self._start = time.monotonic(), time.time()

    def record(self, items: int, signature: str, mode: str, batch_size: int, counters=None) -> None:
        now = time.monotonic()
        entry = BatchEntry(
            t=round(now - self._t0, 4), start=round(self._start, 3), run=self.run, part=self.part, items=items,
            signature=signature, mode=mode, batch_size=batch_size,
            captures=counters.captures if counters is not None else None,
            releases=counters.releases if counters is not None else None,
            evictions=counters.evictions if counters is not None else None)
        self._file.write(json.dumps(asdict(entry)) + "\n")
        if now - self._flushed >= FLUSH_S:
            self._file.flush()
            self._flushed = now

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_timeline(output_dir: Path) -> List[BatchEntry]:
    """Every part's entries of the run that owns output_dir now, in file then line order."""
    folder = Path(output_dir) / TIMELINE_DIR
    current = run_digest(output_dir)
    entries, torn, stale = [], 0, 0
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = BatchEntry(**json.loads(line))
            except (ValueError, TypeError):  # a line torn by a kill, or one from an older format
                torn += 1
                continue
            if current and entry.run != current:
                stale += 1
                continue
            entries.append(entry)
    if torn or stale:
        log.info("timeline: skipped %d torn line(s) and %d line(s) of an overwritten run", torn, stale)
    return entries
