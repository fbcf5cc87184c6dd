"""One progress bar for the job: items/s, the current signature, graph hits and misses.

tqdm draws the bar on a terminal; a plain log line every `log_every_s` keeps non-interactive logs
(Slurm, CI) informative without a carriage-return mess.
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("jobs.progress")


class Progress:
    def __init__(self, total: int, enabled: bool, log_every_s: float):
        self.total, self.done = total, 0
        self.t0 = self._last_log = time.perf_counter()
        self.log_every_s = log_every_s
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="img", dynamic_ncols=True, smoothing=0.1)

    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.t0, 1e-9)

    def update(self, n: int, signature: str, graph: dict) -> None:
        self.done += n
        status = f"{signature} hits {graph.get('hits', 0)} misses {graph.get('misses', 0)}"
        if self._bar is not None:
            self._bar.set_postfix_str(status, refresh=False)
            self._bar.update(n)
        now = time.perf_counter()
        if now - self._last_log >= self.log_every_s or self.done == self.total:
            self._last_log = now
            log.info("progress %d/%d items, %.2f items/s, %s", self.done, self.total, self.rate(), status)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
