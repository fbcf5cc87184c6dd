"""Everything a worker settles before it loads a model: the checked config, the plan it joins (or
makes), its leases, its sink and where its shards go.

    prepare(cfg, ...) ─▶ check_config (jobs/preflight.py) ─▶ rank 0: join or make the plan of
        output_dir (jobs/plan/publish.py; an object store: staged and published, jobs/output/mirror.py),
        take its hold on the run (jobs/worker/presence.py) and check its done units
        (jobs/worker/recheck.py) ─▶ every rank: read the plan, take its hold ─▶ Leaser + UnitSink +
        LeasedPlan over it (assemble)

`assemble` is the part every kind of worker shares: a Ray actor (jobs/cluster/) builds the same
sink and plan over the units its driver hands it instead of leases.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from jobs.config import GenerateConfig
from jobs.models.base import ModelFamily
from jobs.output.claim import run_id, run_lineage
from jobs.output.layout import PLAN_DIR
from jobs.output.leases import HOST
from jobs.output.mirror import LocalShards, open_shards
from jobs.output.staging_claim import StagingClaim
from jobs.plan.identity import Renderer
from jobs.plan.publish import join_or_make_plan
from jobs.plan.units import PlanManifest, read_manifest
from jobs.preflight import Checked, check_config
from jobs.telemetry import startup
from jobs.telemetry.summary import StageTimer
from jobs.worker.lease import Leaser
from jobs.worker.leased_plan import LeasedPlan, PlanSettings
from jobs.worker.presence import Presence
from jobs.worker.ranks import Group, Topology
from jobs.worker.recheck import Recheck, recheck_done_units
from jobs.worker.stop import StopFlag
from jobs.worker.unit_sink import UnitSink
from jobs.worker.unit_source import LeaseSource, UnitSource
from padding import Padder

log = logging.getLogger("jobs.run")


@dataclass
class Prepared:
    """Everything decided before a model is loaded."""

    cfg: GenerateConfig
    family: ModelFamily
    padder: Padder
    output_dir: Path
    plan: LeasedPlan  # batches of the units this worker leases, one unit at a time
    manifest: PlanManifest
    sink: UnitSink
    topo: Topology
    device: torch.device
    staging: Optional[StagingClaim] = None  # an object store's: released when the worker ends
    presence: Optional[Presence] = None  # this worker's hold on the run: released when it ends

    def release_holds(self) -> None:
        """The worker has ended: a job.overwrite of its run, and a job on another staging folder, may go on."""
        if self.presence is not None:
            self.presence.release()
        if self.staging is not None:
            self.staging.release()


def prepare(cfg: GenerateConfig, timer: StageTimer, group: Group, device: torch.device,
            stop: Optional[StopFlag] = None) -> Prepared:
    checked = check_config(cfg)
    topo = group.topo
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir, topo.task_count, cfg.dataset.keep_fields)
    # Before the plan is joined or made (job.overwrite may wipe the bucket): no second staging folder.
    staging = shards.claim_staging(cfg.job.lease_ttl_s)
    owner = f"{HOST}:{os.getpid()}:part{group.topo.part}/{group.topo.parts}"
    presence = Presence(checked.output_dir / PLAN_DIR, owner, cfg.job.lease_ttl_s)
    try:
        prep = _prepare(cfg, checked, shards, staging, presence, owner, timer, group, device, stop)
    except BaseException:
        presence.release()
        if staging is not None:
            staging.release()
        raise
    prep.presence = presence
    return prep


def _prepare(cfg: GenerateConfig, checked: Checked, shards: LocalShards, staging: Optional[StagingClaim],
             presence: Presence, owner: str, timer: StageTimer, group: Group, device: torch.device,
             stop: Optional[StopFlag]) -> Prepared:
    topo, output_dir = group.topo, checked.output_dir
    held = {}
    startup.mark("checks")  # the start-up ends where the plan begins
    with timer("plan"):
        # Rank 0 joins or makes the plan (other jobs on output_dir wait on its lock), taking its hold on
        # the run under that lock; the other ranks read what it settled, covered by its hold until they
        # take their own.
        def join_or_make() -> None:
            manifest = held["manifest"] = join_or_make_plan(cfg, shards, checked.divisor, renderer_of(device),
                                                            on_joined=presence.take)
            check_done_units(cfg, manifest, shards, output_dir, owner)

        group.agree(join_or_make, leader_only=True)
    presence.take()
    plan_dir = output_dir / PLAN_DIR
    manifest = held.get("manifest") or read_manifest(plan_dir)
    leaser = Leaser(plan_dir, owner, cfg.job.lease_ttl_s, staging)
    source = LeaseSource(manifest, plan_dir, leaser, topo.part, cfg.job.wait_for_leases, stop)
    return assemble(cfg, checked, shards, manifest, source, owner, topo, device, staging)


def assemble(cfg: GenerateConfig, checked: Checked, shards: LocalShards, manifest: PlanManifest,
             source: UnitSource, owner: str, topo: Topology, device: torch.device,
             staging: Optional[StagingClaim] = None) -> Prepared:
    """The sink and the plan of a worker whose units come from `source`."""
    plan_dir = checked.output_dir / PLAN_DIR
    sink = UnitSink(checked.output_dir, cfg.sink, plan_dir, source, owner, shards, run=run_id(checked.output_dir),
                    lineage=run_lineage(checked.output_dir))
    order = PlanSettings(batch_sizes=list(cfg.bcg.batch_sizes), pad_short=cfg.bcg.pad_short_batches,
                         dtype=cfg.model.dtype, verify=cfg.job.verify)
    plan = LeasedPlan(manifest, plan_dir, source, sink, order)
    return Prepared(cfg=cfg, family=checked.family, padder=checked.padder, output_dir=checked.output_dir, plan=plan,
                    manifest=manifest, sink=sink, topo=topo, device=device, staging=staging)


def renderer_of(device: torch.device) -> Renderer:
    """This process as the run's renderer: the device part of the run identity is its own (torch's
    CPU thread count changes a CPU run's bytes; jobs/plan/identity.py)."""
    return Renderer(str(device), torch.get_num_threads())


def check_done_units(cfg: GenerateConfig, manifest: PlanManifest, shards: LocalShards, output_dir: Path,
                     owner: str) -> Recheck:
    """Before any unit is leased: every done unit's shards still hold what they committed, or the
    unit is reopened (jobs/worker/recheck.py); job.verify=full hashes them too. The lease-file
    workers' rank 0 and the Ray driver both run it."""
    leaser = Leaser(output_dir / PLAN_DIR, owner, cfg.job.lease_ttl_s)
    check = recheck_done_units(manifest, output_dir / PLAN_DIR, shards, leaser, run_id(output_dir),
                               full=cfg.job.verify == "full")
    if check.reopened:
        log.warning("resume: %d of %d done unit(s) no longer held what they committed and were reopened (%s); "
                    "%d shard(s) moved to %s/_quarantine/ (listed in summary.json): %s", len(check.reopened),
                    check.checked, ", ".join(map(str, check.reopened[:10])), len(check.quarantined), output_dir,
                    ", ".join(q["url"] for q in check.quarantined[:10]) or "none")
    elif check.checked:
        log.info("resume: the shards of %d done unit(s) are as committed", check.checked)
    return check
