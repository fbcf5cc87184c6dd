"""One progress bar for the whole job: done items of every worker, their rate and the ETA.

The counts of the other workers come through output_dir (jobs/job_progress.py), so the bar shows
the job, not this process: with 8 ranks and 4 array tasks, each node's bar (local rank 0) shows
the same done/total and ETA. tqdm draws it on a terminal; a plain log line every `log_every_s`
keeps non-interactive logs (Slurm, CI) informative without a carriage-return mess. With
`job.tensorboard`, the same numbers and the graph runner's counters go to TensorBoard.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Optional

from jobs.job_progress import JobView, SharedProgress, format_eta

log = logging.getLogger("jobs.progress")

VIEW_EVERY_S = 5.0  # the job's view costs a listing of _plan/done/ and _progress/: not every batch


class Progress:
    def __init__(self, shared: SharedProgress, bar: bool, log_every_s: float, job_view: bool = True,
                 tensorboard=None):
        self.shared, self.log_every_s, self.job_view = shared, log_every_s, job_view
        self.tensorboard = tensorboard
        self.done = 0  # by this worker
        self.t0 = self._last_log = time.perf_counter()
        self._last_view = 0.0
        self.view: Optional[JobView] = shared.view() if job_view else None
        self._bar = None
        if bar and job_view and sys.stderr.isatty():
            from tqdm import tqdm

            # The job's counts, so tqdm's own rate and remaining time are the job's.
            self._bar = tqdm(total=self.view.total, initial=self.view.done, unit="img", dynamic_ncols=True,
                             smoothing=0.1)

    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.t0, 1e-9)

    def update(self, n: int, signature: str, graph: dict) -> None:
        self.done += n
        self.shared.add(n)
        now = time.perf_counter()
        log_now = now - self._last_log >= self.log_every_s
        if self.job_view and (log_now or now - self._last_view >= VIEW_EVERY_S):
            self.view = self.shared.view()
            self._last_view = now
        status = f"{signature} hits {graph.get('hits', 0)} misses {graph.get('misses', 0)}"
        if self._bar is not None:
            self._bar.n = self.view.done
            self._bar.set_postfix_str(f"{self.view.workers} worker(s), ETA {format_eta(self.view.eta_s)}, {status}",
                                      refresh=False)
            self._bar.refresh()
        if self.tensorboard is not None:
            self.tensorboard.add(self.shared.meter.count, self.shared.meter.rate(), graph, self.view)
        if log_now:
            self._last_log = now
            job = f"; {self.view.line()}" if self.view is not None else ""
            log.info("progress: this worker %d items, %.2f items/s, %s%s", self.done, self.rate(), status, job)

    def close(self) -> None:
        self.shared.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self._bar is not None:
            self._bar.close()
