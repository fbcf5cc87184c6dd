"""The bar a terminal shows: one count, one rate, one ETA, one unit; log lines around it; the final count.

Real tqdm drawing into a stream that says it is a terminal, real logging handlers, and the real
SharedProgress reading done markers and progress files from a folder.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys

from jobs.telemetry.progress import Progress, SharedProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(raw: str) -> list:
    """What stays on the screen: each line as its last carriage-return segment."""
    return [seg.split("\r")[-1] for seg in raw.split("\n")]


def test_one_bar_log_lines_around_it_and_the_final_count(tmp_path, monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)  # the console handler a Hydra job has writes here
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    logging.root.addHandler(handler)
    plan_dir = tmp_path / "_plan"
    (plan_dir / "done").mkdir(parents=True)
    inflight = {0: 0}
    shared = SharedProgress(tmp_path, plan_dir, "w0", total=40, inflight=lambda: dict(inflight))
    try:
        progress = Progress(shared, bar=True, log_every_s=1e9, stream=term)
        for _ in range(4):
            inflight[0] += 9
            progress.update(9, "128x128/t64/s8/cfg4.5/float32", {"hits": 0, "misses": 0})
            logging.getLogger("jobs.run").warning("unit %d committed", inflight[0])
        # The unit ends: its marker holds all 40 (the last 4 went through the sink, not a batch update).
        (plan_dir / "done" / "unit-0000000.json").write_text(json.dumps({"items": 40}))
        inflight.clear()
        progress.close()
    finally:
        logging.root.removeHandler(handler)
    raw = term.getvalue()
    lines = [line for line in screen(raw) if line.strip()]
    logs = [line for line in lines if "LOG" in line]
    assert logs == [f"LOG unit {n} committed" for n in (9, 18, 27, 36)]  # each on its own line, whole
    bar = [line for line in lines if "LOG" not in line]
    assert len(bar) == 1 and "40/40 items" in bar[0], lines  # one bar, closed on the final count
    assert bar[0].count("ETA") == 1 and "items/s" in bar[0]
    assert not re.search(r"\bit/s\b|\bimg\b|<\d", bar[0])  # no second unit, no tqdm remaining time
    assert "36/40 items" in raw  # between views the bar moved with this worker's items


def test_no_terminal_no_bar(tmp_path):
    plan_dir = tmp_path / "_plan"
    plan_dir.mkdir()
    shared = SharedProgress(tmp_path, plan_dir, "w0", total=4, inflight=dict)
    out = io.StringIO()  # a log file: isatty() is False
    progress = Progress(shared, bar=True, log_every_s=1e9, stream=out)
    progress.update(4, "s", {})
    progress.close()
    assert out.getvalue() == ""
