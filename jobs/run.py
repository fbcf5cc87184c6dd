"""One generation job, from a typed config to committed shards and a summary.

    validate config + output_dir ─▶ load + validate dataset ─▶ plan ─▶ resume filter
        ─▶ load model, wrap transformer ─▶ batches ─▶ AsyncSink ─▶ index + summary.json

Everything that can be wrong with the config or the dataset is found before the model loads.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from jobs.config import GenerateConfig
from jobs.dataset import DatasetError, LoadResult, RowError, format_row_errors, load_dataset, write_error_ledger
from jobs.models.registry import get_family
from jobs.plan import ItemDefaults, Plan, build_plan, resolve_items, text_length_table, without_keys
from jobs.progress import Progress
from jobs.resume import check_writable, committed_keys, dataset_digest, open_run, run_identity
from jobs.summary import JobStats, StageTimer
from padding import get_padder

log = logging.getLogger("jobs.run")

ERRORS_FILE = "errors.jsonl"


@dataclass
class Prepared:
    """Everything decided before a model is loaded."""

    cfg: GenerateConfig
    family: object
    padder: object
    output_dir: Path
    plan: Plan
    data: LoadResult
    errors: List[RowError]
    skipped_done: int


def check_config(cfg: GenerateConfig):
    family = get_family(cfg.model.family)
    padder = get_padder(cfg.model.family, buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    if cfg.model.path is not None:
        family.check_path(cfg.model)
    elif not cfg.model.tiny:
        raise ValueError(f"model.path is not set and preset {cfg.model.name!r} has no `tiny` section: "
                         f"pass model.path=/local/diffusers/folder")
    d = family.spatial_divisor(cfg.model)
    for key, v in (("sampling.height", cfg.sampling.height), ("sampling.width", cfg.sampling.width)):
        if v % d:
            raise ValueError(f"{key}={v} is not a multiple of {d} ({cfg.model.name}: VAE downsampling x patch size); "
                             f"use {max(d, round(v / d) * d)}")
    output_dir = Path(cfg.output_dir)
    check_writable(output_dir)
    return family, padder, output_dir, d


def prepare(cfg: GenerateConfig, timer: StageTimer) -> Prepared:
    family, padder, output_dir, divisor = check_config(cfg)
    with timer("dataset"):
        data = load_dataset(cfg.dataset)  # raises DatasetError under on_error=fail
    with timer("plan"):
        defaults = ItemDefaults(height=cfg.sampling.height, width=cfg.sampling.width, steps=cfg.sampling.steps,
                                guidance_scale=cfg.sampling.guidance_scale, negative_prompt=cfg.sampling.negative_prompt,
                                job_seed=cfg.sampling.seed, dtype=cfg.model.dtype, spatial_divisor=divisor,
                                on_long_prompt=cfg.model.on_long_prompt)
        tokenizer = family.load_tokenizer(cfg.model)
        lengths = text_length_table(
            data.records, defaults,
            lambda texts, instruction: family.text_lengths(tokenizer, texts, cfg.model, instruction))
        items, row_errors = resolve_items(data.records, defaults, lengths, padder.bucket_for)
        if row_errors and cfg.dataset.on_error == "fail":
            raise DatasetError(format_row_errors(data.path, row_errors))
        plan = build_plan(items, cfg.bcg.batch_sizes, cfg.bcg.pad_short_batches,
                          truncated=sum(1 for it in items if it.truncated))
    identity = run_identity(cfg, dataset_digest(data.records), len(data.records))
    open_run(output_dir, identity, cfg.job.overwrite)
    done = committed_keys(output_dir)
    todo = without_keys(plan, done, cfg.bcg.batch_sizes, cfg.bcg.pad_short_batches)
    todo = partition_plan(todo, cfg)
    return Prepared(cfg=cfg, family=family, padder=padder, output_dir=output_dir, plan=todo, data=data,
                    errors=list(data.errors) + row_errors, skipped_done=len(done))


def partition_plan(plan: Plan, cfg: GenerateConfig) -> Plan:
    from jobs.config import parse_partition
    from jobs.partition import take_partition

    index, count = parse_partition(cfg.job.partition)
    return take_partition(plan, index, count)


class StopFlag:
    """SIGTERM / SIGUSR1 (pre-emption): finish the batch in flight, commit, exit resumable."""

    def __init__(self):
        self.reason: Optional[str] = None
        self._previous = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.reason = signal.Signals(signum).name
        log.warning("%s received: finishing the current batch, then committing and exiting", self.reason)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_job(cfg: GenerateConfig) -> JobStats:
    timer = StageTimer()
    prep = prepare(cfg, timer)
    stats = JobStats(model=cfg.model.name, output_dir=str(prep.output_dir), bad_rows=len(prep.errors),
                     items_planned=prep.plan.n_items, items_skipped_done=prep.skipped_done,
                     truncated_prompts=prep.plan.truncated,
                     signatures={str(s): n for s, n in prep.plan.signature_counts.items()})
    if prep.errors:
        write_error_ledger(prep.output_dir / ERRORS_FILE, prep.errors)
        log.warning("%d bad row(s) skipped (dataset.on_error=skip); see %s", len(prep.errors),
                    prep.output_dir / ERRORS_FILE)
    for line in prep.plan.summary_lines():
        log.info(line)
    if prep.skipped_done:
        log.info("resume: %d item(s) already committed in %s are skipped", prep.skipped_done, prep.output_dir)
    from jobs.generate_loop import generate_all

    try:
        generate_all(prep, stats, timer)
    finally:
        stats.stage_seconds = dict(timer.seconds)
        finish(prep, stats)
    return stats


def finish(prep: Prepared, stats: JobStats) -> None:
    from sinks import scan_output, write_wids_index

    records = scan_output(prep.output_dir).records  # every committed shard, this run's and earlier ones
    write_wids_index(prep.output_dir, records)
    stats.write(prep.output_dir)
    for line in stats.lines():
        log.info(line)
