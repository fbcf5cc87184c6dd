"""`run_ray_job`: the Ray driver of `python -m jobs.generate +cluster=ray ...`.

    check the config (jobs/preflight.py) and what a Ray job needs ─▶ connect (connect.py)
    ─▶ join or make the plan of output_dir, as a worker's rank 0 does (an object store: published)
    ─▶ the units not done ─▶ Pool (pool.py): one actor per worker, fed a unit at a time
    ─▶ summary.json and the index (summary.py), also when the job stops early

Everything that can be wrong with the config or the dataset is refused here, before any actor
starts. Resume is rerunning the command: the plan is joined and only units without a done marker
are handed out; a unit an actor left half done continues after its committed shards.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import List

import ray
import torch

from jobs.cluster.actor import Worker
from jobs.cluster.connect import connect, worker_count
from jobs.cluster.grants import Grants, raise_fd_limit
from jobs.cluster.pool import AHEAD, Pool, PoolResult, WorkerFailed
from jobs.cluster.progress import DriverProgress
from jobs.cluster.queue import UnitQueue
from jobs.cluster.summary import merge, ray_block, write_summary
from jobs.config import GenerateConfig
from jobs.errors import UserError
from jobs.output.done import done_units
from jobs.output.layout import BATCHING_FILE, ERRORS_FILE, PLAN_DIR
from jobs.output.leases import HOST
from jobs.output.mirror import LocalShards, open_shards
from jobs.plan.publish import join_or_make_plan
from jobs.plan.units import PlanManifest, UnitInfo
from jobs.preflight import Checked, check_config
from jobs.telemetry import startup
from jobs.telemetry.summary import JobStats, StageTimer
from jobs.worker.prepare import check_done_units, renderer_of
from jobs.worker.presence import Presence
from jobs.worker.stop import StopFlag

log = logging.getLogger("jobs.cluster")

ACTOR_THREADS = 4 + AHEAD  # run, warm, progress, end/halt, and each unit's call


def run_ray_job(cfg: GenerateConfig) -> JobStats:
    startup.job_begins()
    cfg = for_actors(cfg)
    assert cfg.ray is not None  # for_actors checked it: jobs/generate.py comes here only when cfg.ray is set
    checked = check_config(cfg, loads_weights=False)  # the driver plans; actors load
    startup.mark("checks")
    address = connect(cfg.ray)
    workers = worker_count(cfg.ray, ray.cluster_resources(), ray.nodes())
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir)
    # The driver's staging folder is the run's on an object store: a job staging elsewhere (another
    # machine's plain run) is refused while this one is live. Actors stage per node, unclaimed: their
    # units come from this driver, never from lease files another folder could also grant.
    staging = shards.claim_staging(cfg.job.lease_ttl_s)
    # The driver's hold on the run, taken as it joins the plan and kept to its end: its actors load their
    # models holding no unit, and a job.overwrite of the folder is refused meanwhile (jobs/worker/presence.py).
    presence = Presence(checked.output_dir / PLAN_DIR, f"{HOST}:{os.getpid()}:ray-driver", cfg.job.lease_ttl_s)
    startup.mark("connect")  # the start-up ends where the plan begins, as a worker's does
    try:
        return _run_claimed(cfg, checked, shards, address, workers, presence)
    finally:
        presence.release()
        if staging is not None:
            staging.release()


def _run_claimed(cfg: GenerateConfig, checked: Checked, shards: LocalShards, address: str,
                 workers: int, presence: Presence) -> JobStats:
    timer = StageTimer()
    with timer("plan"):
        # The actors' device (for_actors), with the driver's CPU threads: CPU actors take the count the
        # identity records (actor.py's match_threads).
        manifest = join_or_make_plan(cfg, shards, checked.divisor, renderer_of(torch.device(cfg.device)),
                                     on_joined=presence.take)
        check_done_units(cfg, manifest, shards, checked.output_dir, f"{HOST}:{os.getpid()}:ray-driver")
    plan_dir = checked.output_dir / PLAN_DIR
    done = done_units(plan_dir)
    left = [u for u in manifest.units if u.id not in done]
    done_items = manifest.n_items - sum(u.count for u in left)
    n = min(workers, len(left))
    _log_start(manifest, checked.output_dir, shards.shown, done_items, len(left), n)
    progress = DriverProgress(manifest.n_items, done_items, cfg.job.progress, cfg.job.log_every_s)
    result, status, stop = PoolResult(), "failed", StopFlag()
    try:
        if left:
            _generate(cfg, plan_dir, left, n, progress, stop, result)
        status = "preempted" if result.halted else "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        progress.close()
        merged = merge(result, manifest, done_items, dict(timer.seconds), status, cfg.model.name, shards.shown)
        merged.startup_seconds = startup.seconds()  # the driver's own; the actors' first batch is timed from it
        if merged.startup_seconds:
            merged.stage_seconds["startup"] = sum(merged.startup_seconds.values())
        write_summary(checked.output_dir, shards, merged, ray_block(result, address, n))
        for line in merged.lines():
            log.info(line)
    stop.forward()
    return merged


def _generate(cfg: GenerateConfig, plan_dir: Path, left: List[UnitInfo], n: int, progress: DriverProgress,
              stop: StopFlag, result: PoolResult) -> None:
    """The pool over the units left, until they are done or the job stops (`stop`: SIGTERM etc.).
    `result` is filled as actors finish or die, so a failed run's summary still lists them."""
    raise_fd_limit(64 + (1 + AHEAD) * n)
    grants = Grants(plan_dir, f"{HOST}:{os.getpid()}:ray-driver", cfg.job.lease_ttl_s)
    sized = (plan_dir / BATCHING_FILE).exists() or not may_grow(cfg)
    assert cfg.ray is not None  # run_ray_job's for_actors checked it
    pool = Pool(actor_factory(cfg, n), n, UnitQueue(left), grants, progress, cfg.ray.max_restarts, sized,
                cfg.job.wait_for_leases, result)
    stop.install()
    try:
        pool.run(stop)
    except WorkerFailed as e:
        raise e.error from None  # the actor's exception, with its remote traceback
    finally:
        stop.restore()
        grants.release_all()  # a unit left unfinished is free for a rerun at once


def _log_start(manifest: PlanManifest, out: Path, shown: str, done_items: int, units_left: int, n: int) -> None:
    if manifest.dataset["bad_rows"]:
        log.warning("%d bad row(s) skipped (dataset.on_error=skip); see %s", manifest.dataset["bad_rows"],
                    out / ERRORS_FILE)
    if done_items:
        log.info("resume: %d item(s) of done units in %s are skipped", done_items, shown)
    log.info("%d of %d planned items left in %d of %d units; %d worker(s) on Ray", manifest.n_items - done_items,
             manifest.n_items, units_left, len(manifest.units), n)


def for_actors(cfg: GenerateConfig) -> GenerateConfig:
    """The config the actors run: the device their Ray resources give them. Refuses what a Ray
    job cannot honour."""
    r = cfg.ray
    assert r is not None
    if cfg.job.partition != "0/1":
        raise UserError(f"job.partition={cfg.job.partition} splits lease-based workers (torchrun, Slurm arrays); "
                        f"with +cluster=ray the driver hands every unit to its actors: leave job.partition unset")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("+cluster=ray under torchrun (WORLD_SIZE="
                        f"{os.environ['WORLD_SIZE']}): the Ray driver is one process that starts the workers; "
                        "run `python -m jobs.generate +cluster=ray ...` without torchrun")
    if cfg.device == "cuda" and r.gpus_per_worker == 0:
        raise UserError("device=cuda but ray.gpus_per_worker=0: Ray gives the actors no GPU. Set "
                        "ray.gpus_per_worker=1, or device=cpu")
    device = cfg.device if cfg.device != "auto" else ("cuda" if r.gpus_per_worker > 0 else "cpu")
    # Decided here, not on the driver's own hardware: a head node without GPUs still plans a GPU run.
    return dataclasses.replace(cfg, device=device)


def may_grow(cfg: GenerateConfig) -> bool:
    """Whether the actors may measure batch sizes (bcg.batch_grow: auto grows on CUDA only)."""
    return cfg.bcg.batch_grow == "on" or (cfg.bcg.batch_grow == "auto" and cfg.device == "cuda")


def actor_factory(cfg: GenerateConfig, parts: int):
    r = cfg.ray
    assert r is not None  # run_ray_job's for_actors checked it
    actor_class = ray.remote(Worker)
    job = ray.get_runtime_context().get_job_id()
    started_at = startup.started_at()  # the actors time their first batch from the driver's start

    def spawn(part: int):
        # Named so `ray list actors` (and the tests) find them: bcgen-<Ray job>-part0003.
        return actor_class.options(name=f"bcgen-{job}-part{part:04d}", num_gpus=r.gpus_per_worker,
                                   num_cpus=r.cpus_per_worker, max_concurrency=ACTOR_THREADS,
                                   max_restarts=0).remote(cfg, part, parts, started_at)

    return spawn
