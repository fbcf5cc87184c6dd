"""One finished batch -> the sink: each item's json, its sample, the NaN ledger, the job's counts.

A non-finite image is flagged in its json (job.on_nonfinite=record) or sent to errors.jsonl
instead of the shard (ledger); either way its unit still completes. The kill tests' hooks fire
here, at the instants they name (after a batch's first item; while a shard is open).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

from jobs.config import GenerateConfig
from jobs.dataset import NONFINITE_REASON, RowError, write_error_ledger
from jobs.kill_hook import KILL_AT_ENV, kill_hook
from jobs.output.layout import ERRORS_FILE
from jobs.plan import Item
from jobs.telemetry import startup
from jobs.telemetry.summary import JobStats, StageTimer
from jobs.worker.pipeline import BatchResult
from jobs.worker.samples import item_meta, item_sample, sample_kind
from jobs.worker.unit_sink import UnitSink


class Handoff:
    def __init__(self, cfg: GenerateConfig, sink: UnitSink, output_dir: Path, stats: JobStats, timer: StageTimer):
        self.cfg, self.sink, self.output_dir, self.stats, self.timer = cfg, sink, output_dir, stats, timer
        self.batches = 0
        self._hooked = KILL_AT_ENV in os.environ  # kill tests only

    def put(self, result: BatchResult) -> None:
        self.batches += 1
        if self.batches == 1:  # what a user waits for first (None where the front door did not start the process)
            self.stats.first_batch_s = startup.since_start()
            self.stats.first_batch_ms = {k: round(v, 1) for k, v in result.stage_ms.items()}
        ledger: List[RowError] = []
        for i, (it, image, finite) in enumerate(zip(result.items, result.images, result.finite)):
            if not finite:
                self.stats.nonfinite_keys.append(it.key)
                if self.cfg.job.on_nonfinite == "ledger":
                    ledger.append(_nonfinite_row(it))
                    self.sink.skip(it.key)  # its unit still completes
                    continue
            meta = item_meta(it, self.cfg.model.name, result.mode, result.batch_size, finite, result.latent_sha256[i])
            meta.update(result.meta[i] if result.meta else {})
            audio = result.audio[i] if result.audio else None
            with self.timer("sink_wait"):
                sample = item_sample(it, image, meta, self.cfg.sink, audio, result.sample_rate)
                self.sink.put(sample)
            self.stats.items_written += 1
            self.stats.kinds[sample_kind(sample)] += 1
            self.stats.modes[result.mode] += 1
            if self._hooked:  # mid-batch: after the batch's first item; mid-shard: while a shard is open
                kill_hook("batch", self.batches if i == 0 else -1)
                kill_hook("shard-write", len(self.sink.records), self.output_dir)
        if ledger:
            write_error_ledger(self.output_dir / ERRORS_FILE, ledger)


def _nonfinite_row(it: Item) -> RowError:
    path, _, line = it.source.rpartition(":")
    return RowError(file=path, line=int(line or 0), key=it.key, reason=NONFINITE_REASON)
