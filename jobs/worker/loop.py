"""The generation loop: the batches of each leased unit -> stage pipeline -> sink, with progress and clean stops.

A stop signal (StopFlag) is honoured between batches: no new batch starts, the batches in flight
finish and are handed to the sink, and close() commits every complete sample, so a rerun
continues after them.
"""

from __future__ import annotations

import logging
import os
import socket

from jobs.worker.batch_sizer import choose as choose_batch_sizes
from jobs.worker.dispatcher import CapturePolicy
from jobs.worker.pipeline import Engine
from jobs.worker.model import attach_runner, load_pipeline
from jobs.telemetry.gpu_monitor import GpuMonitor
from jobs.telemetry.progress import SharedProgress
from jobs.output.layout import PLAN_DIR
from jobs.telemetry.progress import Progress
from jobs.worker.samples import item_meta, item_sample, sample_kind
from jobs.telemetry.tensorboard import TensorBoardLog
from jobs.worker.scheduler import StagePipeline
from jobs.telemetry.summary import JobStats, StageTimer
from jobs.telemetry.timeline import Timeline

log = logging.getLogger("jobs.run")


def generate_all(prep, stats: JobStats, timer: StageTimer, stop) -> None:
    from jobs.dataset import RowError, write_error_ledger
    from jobs.kill_hook import KILL_AT_ENV, kill_hook
    from jobs.output.layout import ERRORS_FILE
    from sinks import SinkError

    cfg = prep.cfg
    if not prep.plan.n_items:
        stats.status = "complete"
        log.info("nothing to generate: every planned item is already committed")
        return
    device = prep.device
    stats.device = str(device)
    with timer("load"):
        pipe = load_pipeline(prep.family, cfg, device)
        runner = attach_runner(prep.family, pipe, cfg, device)
    engine = Engine(cfg, prep.family, pipe, prep.padder, runner, device)
    with timer("batch_sizing"):
        pick = choose_batch_sizes(cfg, prep.manifest, prep.output_dir / PLAN_DIR, engine,
                                  on_published=prep.sink.shards.on_plan_file)
    prep.plan.settings.batch_sizes = pick.sizes
    engine.set_pool(pick.sizes)
    stats.batching = pick.to_json()
    policy = CapturePolicy(mode=cfg.bcg.capture, min_gain=cfg.bcg.capture_min_gain)
    overlap = cfg.job.overlap if cfg.job.overlap is not None else device.type == "cuda"
    stages = StagePipeline(engine, policy, overlap=overlap)
    topo = prep.topo
    # One timeline file per worker process (`python -m jobs.inspect`): workers of one part may run at once.
    worker = f"part{topo.part:04d}-{socket.gethostname()}-{os.getpid()}"
    timeline = Timeline(prep.output_dir, worker)
    sink = prep.sink  # one sink over the units this worker leases (jobs/worker/unit_sink.py)
    # One bar per node, for the whole job; every worker publishes its counts, and other ranks
    # still log their own progress lines every log_every_s.
    shared = SharedProgress(prep.output_dir, prep.output_dir / PLAN_DIR, worker, prep.manifest.n_items, sink.inflight)
    tensorboard = TensorBoardLog(cfg.job.tensorboard, worker) if cfg.job.tensorboard else None
    progress = Progress(shared, cfg.job.progress, cfg.job.log_every_s, job_view=topo.local_rank == 0,
                        tensorboard=tensorboard)
    hooked = KILL_AT_ENV in os.environ  # kill tests only
    monitor = GpuMonitor(device)
    stopped, results = False, None

    def should_stop() -> bool:
        nonlocal stopped
        stopped = stopped or bool(stop.reason)  # a signal during the last batch still ends complete
        return stopped

    try:
        # "generate" is the whole stage loop, sink hand-off included: what images/s is measured on.
        # One stage run per unit: a unit is one signature's run, which the capture policy weighs.
        number, current = 0, None
        with timer("generate"), monitor:
            timeline.start()
            for unit_batches in prep.plan.units():
                if should_stop():
                    break
                if current is not None and unit_batches[0].signature != current:
                    engine.end_run()  # the previous unit's signature: its graphs are not needed now
                current = unit_batches[0].signature
                results = stages.run(unit_batches, should_stop)
                for result in results:
                    number += 1
                    ledger = []
                    for i, (it, image, finite) in enumerate(zip(result.items, result.images, result.finite)):
                        if not finite:
                            stats.nonfinite_keys.append(it.key)
                            if cfg.job.on_nonfinite == "ledger":
                                path, _, line = it.source.rpartition(":")
                                ledger.append(RowError(file=path, line=int(line or 0), key=it.key,
                                                       reason="generated image has NaN/Inf values"))
                                sink.skip(it.key)  # its unit still completes
                                continue
                        meta = item_meta(it, cfg.model.name, result.mode, result.batch_size, finite)
                        meta.update(result.meta[i] if result.meta else {})
                        audio = result.audio[i] if result.audio else None
                        with timer("sink_wait"):
                            sample = item_sample(it, image, meta, cfg.sink, audio, result.sample_rate)
                            sink.put(sample)
                        stats.items_written += 1
                        stats.kinds[sample_kind(sample)] += 1
                        stats.modes[result.mode] += 1
                        if hooked:  # mid-batch: after the batch's first item; mid-shard: while a shard is open
                            kill_hook("batch", number if i == 0 else -1)
                            kill_hook("shard-write", len(sink.records), prep.output_dir)
                    if ledger:
                        write_error_ledger(prep.output_dir / ERRORS_FILE, ledger)
                    progress.update(len(result.items), str(result.items[0].signature), runner.stats() if runner else {})
                    timeline.record(len(result.items), str(result.items[0].signature), result.mode, result.batch_size,
                                    runner.counters if runner else None)
        with timer("sink_close"):
            sink.close()
        stats.status = "preempted" if stopped else "complete"
    except SinkError:
        stats.status = "failed"
        sink.abort()  # the open shard is torn; committed shards are intact
        raise
    except BaseException as e:
        stats.status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        try:
            sink.close()  # commit every complete sample: a rerun continues after them
        except SinkError:
            sink.abort()
        log.warning("%s: committed every complete sample to %s. Rerun the same command to resume.",
                    "interrupted" if stats.status == "interrupted" else "failed", prep.output_dir)
        raise
    finally:
        if results is not None:
            results.close()  # stops the prefetch thread if the loop ended early
        progress.close()
        timeline.close()
        engine.end_run()
        stats.oom_splits = engine.oom_splits
        stats.graph = runner.stats() if runner else {}
        stats.overlap = overlap
        stats.gpu_stage_ms = {k: round(v, 1) for k, v in stages.stage_ms.items()}
        stats.capture_policy = policy.report() if runner is not None and runner.backend is not None else []
        stats.gpu_busy = monitor.busy()
        stats.sink = sink.stats()
        stats.shards = len(sink.records)
