"""Pre-emption: SIGTERM / SIGUSR1 / SIGUSR2 end the job cleanly between batches.

The batch in flight finishes, every complete sample is committed, and the job exits 143 so Slurm or
submitit can requeue it; a rerun continues after the committed samples.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

log = logging.getLogger("jobs.run")


class StopFlag:
    """SIGTERM / SIGUSR1 / SIGUSR2 (pre-emption): finish the batch in flight, commit, exit resumable.

    SIGUSR2 is submitit's "time is nearly up" signal: once this job has committed and written its
    summary, `forward()` hands the signal to the handler that was there before (submitit's), which
    requeues the job; without one, the job exits 143 and the scheduler or the user reruns it.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

    def __init__(self):
        self.reason: Optional[str] = None
        self._signum: Optional[int] = None
        self._previous = {}
        self._forward_to = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.reason, self._signum = signal.Signals(signum).name, signum
        log.warning("%s received: finishing the current batch, then committing and exiting", self.reason)

    def restore(self) -> None:
        if self._signum is not None:
            self._forward_to = self._previous.get(self._signum)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def forward(self) -> None:
        """Call the handler the received signal had before install() (after the commit)."""
        handler = self._forward_to
        if callable(handler) and handler is not signal.default_int_handler:
            log.info("passing %s on to the handler installed before this job (submitit: requeue)", self.reason)
            handler(self._signum, None)
