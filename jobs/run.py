"""One generation job, from a typed config to committed shards and a summary.

    validate config + output_dir ─▶ load + validate dataset ─▶ plan ─▶ rank 0 claims output_dir
        ─▶ barrier ─▶ take this process's part ─▶ drop committed keys ─▶ load model ─▶ batches
        ─▶ AsyncSink (this part's shard names) ─▶ barrier ─▶ rank 0: index + summary.json

Everything that can be wrong with the config or the dataset is found before the model loads.
One process or many (jobs/distributed.py): the plan is the same everywhere, and the part is cut
from the whole plan *before* committed keys are dropped, so a part's share does not depend on
how far the others got; array tasks started hours apart still cut the same shares.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import torch

from jobs.errors import UserError
from jobs.config import GenerateConfig
from jobs.dataset import DatasetError, LoadResult, RowError, format_row_errors, load_dataset, write_error_ledger
from jobs.distributed import (Group, Topology, merge_stats, pick_device, read_part_summaries, shard_glob, topology,
                              write_part_summary, writer_name)
from jobs.models.lora import check_loras
from jobs.models.registry import get_family
from jobs.partition import take_partition
from jobs.plan import ItemDefaults, Plan, build_plan, resolve_items, text_length_table, without_keys
from jobs.resume import (WriterLock, check_writable, committed_keys, dataset_digest, dir_lock,
                         kill_hook, open_run, run_identity)
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
    plan: Plan  # this part's share, less what is committed
    data: LoadResult
    errors: List[RowError]
    skipped_done: int
    topo: Topology
    device: torch.device
    writer_lock: Optional[WriterLock] = None


def check_config(cfg: GenerateConfig):
    family = get_family(cfg.model.family)
    padder = get_padder(cfg.model.family, buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    check_loras(cfg.model.loras, family.pipeline_class)
    if cfg.model.path is not None:
        family.check_path(cfg.model)
    elif not cfg.model.tiny:
        raise UserError(f"model.path is not set and preset {cfg.model.name!r} has no `tiny` section: "
                         f"pass model.path=/local/diffusers/folder")
    d = family.spatial_divisor(cfg.model)
    for key, v in (("sampling.height", cfg.sampling.height), ("sampling.width", cfg.sampling.width)):
        if v % d:
            raise UserError(f"{key}={v} is not a multiple of {d} ({cfg.model.name}: VAE downsampling x patch size); "
                             f"use {max(d, round(v / d) * d)}")
    output_dir = Path(cfg.output_dir)
    check_writable(output_dir)
    return family, padder, output_dir, d


def build_full_plan(cfg: GenerateConfig, family, padder, divisor: int, data: LoadResult):
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
        raise DatasetError(format_row_errors(data.path, row_errors)
                           + "\nFix these rows, or set dataset.on_error=skip to generate the good rows "
                             "and write the bad ones to errors.jsonl in output_dir.", row_errors)
    plan = build_plan(items, cfg.bcg.batch_sizes, cfg.bcg.pad_short_batches,
                      truncated=sum(1 for it in items if it.truncated))
    return plan, row_errors


def prepare(cfg: GenerateConfig, timer: StageTimer, group: Group, device: torch.device) -> Prepared:
    family, padder, output_dir, divisor = check_config(cfg)
    topo = group.topo
    with timer("dataset"):
        data = load_dataset(cfg.dataset)  # raises DatasetError under on_error=fail
    with timer("plan"):
        plan, row_errors = build_full_plan(cfg, family, padder, divisor, data)
        kill_hook("plan")
    identity = run_identity(cfg, dataset_digest(data.records), len(data.records))
    errors = list(data.errors) + row_errors

    def claim():
        open_run(output_dir, identity, cfg.job.overwrite)
        # Rewritten, not appended: a resumed run lists each bad row once. Items whose images were
        # NaN/Inf are not committed, so they are redone and re-appended during generation.
        (output_dir / ERRORS_FILE).unlink(missing_ok=True)
        if errors:
            write_error_ledger(output_dir / ERRORS_FILE, errors)

    # Rank 0 claims (and, with job.overwrite, wipes) before any rank looks at the shards.
    group.agree(claim, leader_only=True)
    mine = take_partition(plan, topo.part, topo.parts)
    held = {}
    quarantined: list = []

    def lock_and_scan():
        held["lock"] = WriterLock(output_dir, writer_name(topo.part, topo.parts))
        held["done"] = committed_keys(output_dir, shard_glob(topo.part, topo.parts), within=set(mine.keys()),
                                      verify=cfg.job.verify, quarantined=quarantined)

    group.agree(lock_and_scan)
    done = held["done"]
    if quarantined:
        log.warning("resume: %d committed shard(s) no longer match their manifests and were moved to %s/_quarantine/ "
                    "(listed in summary.json): %s; their samples are generated again", len(quarantined), output_dir,
                    ", ".join(q["url"] for q in quarantined[:10]))
    todo = without_keys(mine, done, cfg.bcg.batch_sizes, cfg.bcg.pad_short_batches)
    if topo.parts > 1:
        log.info("%s: %d of %d planned items, %d already committed", topo, mine.n_items, plan.n_items, len(done))
    return Prepared(cfg=cfg, family=family, padder=padder, output_dir=output_dir, plan=todo, data=data,
                    errors=errors, skipped_done=len(done), topo=topo, device=device,
                    writer_lock=held["lock"])


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


def run_job(cfg: GenerateConfig) -> JobStats:
    timer = StageTimer()
    topo = topology(cfg.job.partition)
    device = pick_device(cfg.device, topo.local_rank)
    group = Group(topo, device, cfg.job.dist_timeout_min)
    try:
        return _run(cfg, timer, group, device)
    finally:
        group.close()


def _run(cfg: GenerateConfig, timer: StageTimer, group: Group, device: torch.device) -> JobStats:
    prep = prepare(cfg, timer, group, device)
    stats = JobStats(model=cfg.model.name, output_dir=str(prep.output_dir), bad_rows=len(prep.errors),
                     items_planned=prep.plan.n_items, items_skipped_done=prep.skipped_done,
                     truncated_prompts=prep.plan.truncated,
                     signatures={str(s): n for s, n in prep.plan.signature_counts.items()})
    if prep.errors and prep.topo.part == 0:  # the ledger was written when the run was claimed
        log.warning("%d bad row(s) skipped (dataset.on_error=skip); see %s", len(prep.errors),
                    prep.output_dir / ERRORS_FILE)
    for line in prep.plan.summary_lines():
        log.info(line)
    if prep.skipped_done:
        log.info("resume: %d item(s) already committed in %s are skipped", prep.skipped_done, prep.output_dir)
    from jobs.generate_loop import generate_all

    stop = StopFlag()
    stop.install()
    ended = False
    try:
        generate_all(prep, stats, timer, stop)
        ended = True
    finally:
        stop.restore()
        stats.stage_seconds = dict(timer.seconds)
        prep.writer_lock.close()
        finish(prep, stats, group, met=ended)
    stop.forward()
    return stats


def finish(prep: Prepared, stats: JobStats, group: Group, met: bool) -> None:
    """Record this part; then, once every rank of the group is done, rank 0 writes the index and
    the summary of all parts. `met=False` (an exception) skips the meeting: another rank may still
    be generating, and torchrun stops the whole group when this one exits non-zero."""
    topo, out = prep.topo, prep.output_dir
    write_part_summary(out, topo, stats)
    if topo.world > 1:
        if not met:
            return
        group.barrier()
    if not topo.leader:
        log.info("%s %s: %d images written", topo, stats.status, stats.items_written)
        return
    # Array tasks finish one after another: each writes the index of what is committed so far,
    # under a lock, and the last one's covers everything.
    with dir_lock(out, "finish"):
        merged = write_index_and_summary(out, topo)
    for line in merged.lines():
        log.info(line)


def write_index_and_summary(out: Path, topo: Topology) -> JobStats:
    import json

    from sinks import write_wids_index
    from sinks.atomic import atomic_write_bytes
    from sinks.manifest import indexed_records, remove_temps
    from sinks.quarantine import quarantine_log

    if topo.task_count == 1:  # no other writer can be alive: clean every torn temp, any layout's
        remove_temps(out, "shard-*.tar")
    # From manifests only (each shard was checked when this run resumed, or written by it): a stray
    # .tar in output_dir is never indexed.
    write_wids_index(out, indexed_records(out))
    parts = read_part_summaries(out, topo.parts)
    merged = merge_stats(parts, topo.parts)
    data = merged.to_json()
    data["quarantined"] = quarantine_log(out)  # every shard moved aside in this output_dir, and why
    if topo.parts > 1:
        data["parts"] = [{"part": p["part"], "status": p["status"], "items_written": p["items_written"],
                          "generate_s": p["stage_seconds"].get("generate", 0.0)} for p in parts]
        gen = [row["generate_s"] for row in data["parts"]]
        log.info("parts: %d of %d reported; generate time per part %.1fs .. %.1fs (the slowest sets the wall clock)",
                 len(parts), topo.parts, min(gen), max(gen))
    atomic_write_bytes(out / "summary.json", (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    return merged
