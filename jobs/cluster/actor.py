"""`Worker`: one bcgen worker as a Ray actor, long-lived: one model load, graphs warm across units.

    run()              prepare (the config check, this node's staging folder, the plan) and the
                       ordinary generation loop over a UnitFeed; returns this worker's JobStats
    generate(unit)     hand it a unit; returns when the unit is released: {unit, done, written}
    warm()             returns once the loop asked for its first unit (model loaded, batch sizes
                       published), so the driver can start the other actors on the same sizes
    progress()         items of its open units committed or on their way (the driver's bar)
    end() / halt(why)  no more units / stop between batches, commit every complete sample

The driver calls these from its own thread, concurrently (a threaded actor: `max_concurrency`),
while run() occupies one thread for the actor's life.

With an object-store output_dir the actor works in its node's staging folder, fetched from the
store (jobs/output/mirror.py hydrate: the plan, done markers, batch sizes); units are fetched when
given. Nothing is shared with the driver but the store. A CPU run uses the thread count its run
identity recorded (jobs/plan/identity.py): Ray starts actors with one thread, and 1 and 2 threads
give different bytes.
"""

from __future__ import annotations

import logging
import os
from fnmatch import fnmatch
from typing import Optional

import torch

from jobs.cluster.feed import UnitFeed
from jobs.config import GenerateConfig
from jobs.output.claim import dir_lock
from jobs.output.layout import BATCHING_FILE, PLAN_DIR, unit_name, unit_shard_glob
from jobs.output.leases import HOST
from jobs.output.mirror import Mirror, open_shards
from jobs.plan.units import PlanManifest, UnitInfo, read_manifest
from jobs.preflight import check_config
from jobs.telemetry import startup
from jobs.telemetry.summary import JobStats, StageTimer
from jobs.worker.loop import generate_all
from jobs.worker.prepare import Prepared, assemble
from jobs.worker.ranks import Topology, pick_device
from jobs.worker.run import record_plan
from jobs.worker.stop import StopFlag

log = logging.getLogger("jobs.cluster")

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, as the driver logs


class Worker:
    def __init__(self, cfg: GenerateConfig, part: int, parts: int, started_at: Optional[float] = None):
        if not logging.getLogger().handlers:  # Ray forwards the actor's stderr to the driver
            logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        if started_at is not None:  # the driver's start (a unix time): summary.json's first_batch_s counts from it
            startup.arm_at(started_at)
        self.cfg, self.part, self.parts = cfg, part, parts
        self.stats = JobStats(model=cfg.model.name)
        self.stop = StopFlag()
        self.feed = UnitFeed()
        self.prep: Optional[Prepared] = None

    def where(self) -> str:
        return f"{HOST} pid {os.getpid()}"

    def run(self) -> dict:
        timer = StageTimer()
        ok = False
        try:
            self.prep = prepare_actor(self.cfg, self.part, self.parts, self.feed)
            match_threads(self.prep.manifest, self.prep.device)
            self.stats.output_dir = self.prep.sink.shards.shown
            generate_all(self.prep, self.stats, timer, self.stop)
            ok = True
        finally:
            self.feed.release_all()  # the driver's waiting calls return; their units are not done
            if self.prep is not None:
                record_plan(self.stats, self.prep, timer, count_done_at_start=False)  # the driver counts those
                if ok:
                    self.prep.sink.shards.push_end(leader=False)  # this node's timeline (an object store)
        return self.stats.to_json()

    def generate(self, info: UnitInfo) -> dict:
        if self.feed.give(info):
            self.feed.wait(info.id)
        if self.prep is None:
            return {"unit": info.id, "done": False, "written": 0}
        mine = unit_shard_glob(info.id)
        written = sum(r.nsamples for r in _read(lambda: self.prep.sink.records) if fnmatch(r.url, mine))
        return {"unit": info.id, "done": info.id in self.prep.sink.units_done, "written": written}

    def warm(self) -> bool:
        self.feed.asked.wait()
        return True

    def progress(self) -> dict:
        return {} if self.prep is None else _read(self.prep.sink.inflight)

    def end(self) -> None:
        self.feed.close()

    def halt(self, reason: str) -> None:
        self.stop.reason = reason
        self.feed.close()


def _read(read):
    """What the sink reports, read from the driver's thread while the loop may change it."""
    for _ in range(5):
        try:
            return read()
        except RuntimeError:  # the loop opened or closed a unit meanwhile ("changed size during iteration")
            continue
    return read()


def prepare_actor(cfg: GenerateConfig, part: int, parts: int, feed: UnitFeed) -> Prepared:
    """prepare() of a worker whose driver made the plan and hands out its units."""
    checked = check_config(cfg)
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir)
    plan_dir = checked.output_dir / PLAN_DIR
    if isinstance(shards, Mirror):
        with dir_lock(shards.output_dir, "mirror"):
            shards.hydrate(overwrite=False)  # this node's copy of the plan, done markers, batch sizes
    manifest = read_manifest(plan_dir)
    if isinstance(shards, Mirror) and not (plan_dir / BATCHING_FILE).exists():
        shards.fetch_unit(plan_dir / f"{unit_name(sizing_unit(manifest).id)}.parquet")
    topo = Topology(rank=part, world=parts, local_rank=part)
    device = pick_device(cfg.device, 0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
    owner = f"{HOST}:{os.getpid()}:ray-part{part}"
    return assemble(cfg, checked, shards, manifest, feed, owner, topo, device)


def sizing_unit(manifest: PlanManifest) -> UnitInfo:
    """The unit batch sizing probes with (jobs/worker/batch_sizer.py choose: the largest unit of the
    most common signature). With an object store a unit comes down when it is handed out, and this
    one is read before any is, by the actor that measures: it is fetched first. The rule is
    choose()'s; tests/test_cluster_ray.py measures on an S3 output_dir, so a change there shows."""
    counts: dict = {}
    for u in manifest.units:
        counts[u.signature] = counts.get(u.signature, 0) + u.count
    sig = max(counts, key=lambda s: (counts[s], s))
    return max((u for u in manifest.units if u.signature == sig), key=lambda u: (u.count, -u.id))


def match_threads(manifest: PlanManifest, device: torch.device) -> None:
    threads = manifest.identity.get("cpu_threads")
    if device.type == "cpu" and threads and torch.get_num_threads() != threads:
        log.info("CPU threads %d -> %d: the run identity's count (its bytes depend on it)", torch.get_num_threads(),
                 threads)
        torch.set_num_threads(threads)
