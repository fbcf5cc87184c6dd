"""The generation loop: the batches of each leased unit -> stage scheduler -> sink, with progress
and clean stops.

    load (model.py: pipeline + graph runner) ─▶ batch sizing (batch_sizer.py: the pool)
    ─▶ for each leased unit: scheduler.run(its batches) ─▶ handoff.put(each result) ─▶ watch.batch
    ─▶ sink.close(): commit; the stats say how it ended

A stop signal (StopFlag) is honoured between batches: no new batch starts, the batches in flight
finish and are handed to the sink, and close() commits every complete sample, so a rerun
continues after them.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Optional

from bcg import GraphRunner
from bcg.rewrites import Rewrite
from jobs.errors import EnvironmentFailure
from jobs.kill_hook import kill_hook
from jobs.output.claim import run_id
from jobs.output.done import done_units
from jobs.output.layout import PLAN_DIR
from jobs.telemetry.library_warnings import RepeatedWarnings
from jobs.telemetry.summary import JobStats, StageTimer
from jobs.telemetry.watch import Watch
from jobs.worker.batch_sizer import choose as choose_batch_sizes
from jobs.worker.dispatcher import CaptureDispatcher
from jobs.worker.handoff import Handoff
from jobs.worker.model import attach_decoder_fusions, attach_runner, batch_invariance, invariance_report, load_pipeline
from jobs.worker.pipeline import Pipeline
from jobs.worker.prepare import Prepared
from jobs.worker.scheduler import StageScheduler
from jobs.worker.stop import StopFlag
from sinks import SinkError

log = logging.getLogger("jobs.run")


@dataclass
class Loaded:
    """The model side of a worker, ready to generate."""

    pipeline: Pipeline
    runner: Optional[GraphRunner]  # None with bcg.enabled=false
    dispatcher: CaptureDispatcher
    stages: StageScheduler
    warned: RepeatedWarnings  # the pipeline's per-batch warnings, said once and counted
    decoder_fusions: Optional[Rewrite] = None  # the VAE's fused blocks (bcg.decoder_fusions), when any


def generate_all(prep: Prepared, stats: JobStats, timer: StageTimer, stop: StopFlag) -> None:
    if not prep.plan.n_items:
        stats.status = "complete"
        log.info("nothing to generate: every planned item is already committed")
        return
    stats.device = str(prep.device)
    with batch_invariance(prep.cfg, prep.device) as invariance:  # bcg.invariant: from before the load to the end
        try:
            _generate(prep, stats, timer, stop)
        finally:
            stats.invariant = invariance_report(invariance)


def _generate(prep: Prepared, stats: JobStats, timer: StageTimer, stop: StopFlag) -> None:
    loaded = _load(prep, stats, timer)
    watch = _watch(prep)
    handoff = Handoff(prep.cfg, prep.sink, prep.output_dir, stats, timer)
    stopped = False

    def should_stop() -> bool:
        nonlocal stopped
        stopped = stopped or bool(stop.reason)  # a signal during the last batch still ends complete
        return stopped

    try:
        # "generate" is the whole stage loop, sink hand-off included: what images/s is measured on.
        with timer("generate"), watch:
            _run_units(prep, loaded, handoff, watch, should_stop)
        with timer("sink_close"):
            prep.sink.close()
        # A signal while the model loads, while leases are awaited or in a unit's last batch ends the loop with
        # no batch left to refuse: the source just gives no next unit. It is a preemption (exit 143, which a
        # scheduler requeues) unless the plan is done; a signal in the job's very last batch still ends complete.
        stopped = stopped or (bool(stop.reason) and _units_not_done(prep) > 0)
        stats.status = "preempted" if stopped else "complete"
    except SinkError:
        stats.status = "failed"
        prep.sink.abort()  # the open shard is torn; committed shards are intact
        raise
    except BaseException as e:
        stats.status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        _commit_what_is_complete(prep)
        if not isinstance(e, EnvironmentFailure):  # its own one line (jobs/errors.py) says this and more
            log.warning("%s: committed every complete sample to %s. Rerun the same command to resume.",
                        stats.status, prep.output_dir)
        raise
    finally:
        watch.close()
        loaded.dispatcher.end_run()
        loaded.warned.uninstall()
        _record(stats, loaded, watch, prep)


def _load(prep: Prepared, stats: JobStats, timer: StageTimer) -> Loaded:
    cfg = prep.cfg
    parts = StageTimer()  # the load stage's own parts (summary.json's load_seconds): where a slow load went
    with timer("load"):
        kill_hook("load")
        pipe = load_pipeline(prep.family, cfg, prep.device, parts)
        with parts("runner"):
            runner = attach_runner(prep.family, pipe, cfg)
        with parts("decoder_fusions"):
            decoder_fusions = attach_decoder_fusions(pipe, cfg, prep.device)
    stats.load_seconds = {k: round(v, 3) for k, v in parts.seconds.items()}
    warned = RepeatedWarnings().install(pipe)  # batch sizing's probes encode real prompts too
    dispatcher = CaptureDispatcher(runner, cfg.bcg)
    pipeline = Pipeline(cfg, prep.family, pipe, prep.padder, runner, prep.device, gpu_lock=dispatcher.lock)
    with timer("batch_sizing"):
        try:
            pick = choose_batch_sizes(cfg, prep.manifest, prep.output_dir / PLAN_DIR, pipeline,
                                      run_id(prep.output_dir), on_published=prep.sink.shards.on_plan_file,
                                      lineage=prep.sink.lineage)
        except BaseException:
            warned.uninstall()
            raise
    prep.plan.settings.batch_sizes = pick.sizes
    dispatcher.set_pool(pick.sizes)
    stats.batching = pick.to_json()
    overlap = cfg.job.overlap if cfg.job.overlap is not None else prep.device.type == "cuda"
    stats.overlap = overlap
    stages = StageScheduler(pipeline, dispatcher, overlap=overlap)
    return Loaded(pipeline=pipeline, runner=runner, dispatcher=dispatcher, stages=stages, warned=warned,
                  decoder_fusions=decoder_fusions)


def _watch(prep: Prepared) -> Watch:
    # One timeline file per worker process (`python -m jobs.inspect`): workers of one part may run at once.
    topo, job = prep.topo, prep.cfg.job
    worker = f"part{topo.part:04d}-{socket.gethostname()}-{os.getpid()}"
    return Watch(prep.output_dir, worker, prep.manifest.n_items, prep.sink.inflight, job.progress, job.log_every_s,
                 job.tensorboard, show_job=topo.local_rank == 0, device=prep.device)


def _run_units(prep: Prepared, loaded: Loaded, handoff: Handoff, watch: Watch, should_stop) -> None:
    """One stage run per unit: a unit is one signature's run, which the capture dispatcher weighs."""
    runner, current = loaded.runner, None
    for unit_batches in prep.plan.units():
        if should_stop():
            return
        if current is not None and unit_batches[0].signature != current:
            loaded.dispatcher.end_run()  # the previous unit's signature: its graphs are not needed now
        current = unit_batches[0].signature
        results = loaded.stages.run(unit_batches, should_stop)
        try:
            for result in results:
                handoff.put(result)
                watch.batch(len(result.items), str(result.items[0].signature), result.mode, result.batch_size,
                            runner.stats() if runner else {}, runner.counters if runner else None)
        finally:
            results.close()  # stops the prefetch thread if the loop ended early


def _units_not_done(prep: Prepared) -> int:
    """The plan's units without a done marker, by any worker: what a stopped job leaves for its rerun."""
    done = done_units(prep.plan.plan_dir)
    return sum(1 for u in prep.plan.manifest.units if u.id not in done)


def _commit_what_is_complete(prep: Prepared) -> None:
    try:
        prep.sink.close()  # commit every complete sample: a rerun continues after them
    except SinkError:
        prep.sink.abort()


def _record(stats: JobStats, loaded: Loaded, watch: Watch, prep: Prepared) -> None:
    runner = loaded.runner
    stats.oom_splits = loaded.pipeline.oom_splits
    stats.graph = runner.stats() if runner else {}
    if loaded.decoder_fusions is not None:
        stats.graph["decoder_fusions"] = loaded.decoder_fusions.stats()
    stats.gpu_stage_ms = {k: round(v, 1) for k, v in loaded.stages.stage_ms.items()}
    stats.capture_policy = loaded.dispatcher.report()
    stats.gpu_busy = watch.gpu_busy()
    stats.sink = prep.sink.stats()
    stats.shards = len(prep.sink.records)
    stats.library_warnings = loaded.warned.report()
