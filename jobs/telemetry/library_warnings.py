"""Warnings a pipeline prints on every batch, said once and counted.

diffusers' `encode_prompt` warns whenever a tokenizer cuts a prompt, on every batch that holds one,
with the cut text of every row of the batch (a short prompt beside a long one shows a run of pad
tokens). Flux's CLIP reads 77 tokens, so at realistic prompt lengths nearly every batch warns: 88 KB
of stderr for 200 prompts, hundreds of MB over a million, and nothing in it a person can act on
batch by batch. So the job logs the first warning of each kind once, without the text, and counts
them all: `summary.json` (`library_warnings`: the warning's reason -> batches) and the closing
summary. The cut is the model's own (Flux's pooled CLIP embedding reads the first 77 tokens, as in
diffusers' loop); what the planner counts is `truncated_prompts`, prompts past the text length the
transformer sees.

The filter sits on the loggers of the pipeline's own modules (its class and bases under
`diffusers.`): a logger's filter sees the records logged on that logger, which is where
`encode_prompt` logs. Nothing else those loggers say is touched.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Dict, List

log = logging.getLogger("jobs.run")

#: the start of each warning said once and counted; the reason is the message up to its first ": "
REPEATED = ("The following part of your input was truncated because",)


class RepeatedWarnings(logging.Filter):
    """Said once per reason, then counted (records from the encode thread too: under a lock)."""

    def __init__(self) -> None:
        super().__init__("bcgen.repeated_warnings")
        self.counts: Counter = Counter()
        self.loggers: List[logging.Logger] = []
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(REPEATED):
            return True
        reason = message.split(": ", 1)[0]
        with self._lock:
            self.counts[reason] += 1
            first = self.counts[reason] == 1
        if first:
            log.warning("%s (%s, on a batch; said once: the closing summary counts the batches it is said on)",
                        reason, record.name)
        return False

    def install(self, pipe) -> "RepeatedWarnings":
        """On the loggers of `pipe`'s modules, replacing one a failed job in this process left there."""
        names = {c.__module__ for c in type(pipe).__mro__ if c.__module__.startswith("diffusers.")}
        for name in sorted(names):
            logger = logging.getLogger(name)
            for old in [f for f in logger.filters if isinstance(f, RepeatedWarnings)]:
                logger.removeFilter(old)
            logger.addFilter(self)
            self.loggers.append(logger)
        return self

    def uninstall(self) -> None:
        for logger in self.loggers:
            logger.removeFilter(self)
        self.loggers = []

    def report(self) -> Dict[str, int]:
        with self._lock:
            return dict(self.counts)
