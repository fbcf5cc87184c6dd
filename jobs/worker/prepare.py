"""Everything a worker settles before it loads a model: the checked config, the plan it joins (or
makes), its leases, its sink and where its shards go.

    prepare(cfg, ...) ─▶ check_config (jobs/preflight.py) ─▶ rank 0: join or make the plan of
        output_dir (jobs/plan/publish.py; an object store: staged and published, jobs/output/mirror.py)
        ─▶ every rank: read the plan ─▶ Leaser + UnitSink + LeasedPlan over it
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
from jobs.output.claim import run_id
from jobs.output.layout import PLAN_DIR
from jobs.output.leases import HOST
from jobs.output.mirror import LocalShards, open_shards
from jobs.output.staging_claim import StagingClaim
from jobs.plan.publish import join_or_make_plan
from jobs.plan.units import PlanManifest, read_manifest
from jobs.preflight import Checked, check_config
from jobs.telemetry.summary import StageTimer
from jobs.worker.lease import Leaser
from jobs.worker.recheck import Recheck, recheck_done_units
from jobs.worker.leased_plan import LeasedPlan, PlanSettings
from jobs.worker.ranks import Group, Topology
from jobs.worker.stop import StopFlag
from jobs.worker.unit_sink import UnitSink
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

    def release_staging(self) -> None:
        if self.staging is not None:
            self.staging.release()


def prepare(cfg: GenerateConfig, timer: StageTimer, group: Group, device: torch.device,
            stop: Optional[StopFlag] = None) -> Prepared:
    checked = check_config(cfg)
    topo = group.topo
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir, topo.task_count)
    # Before the plan is joined or made (job.overwrite may wipe the bucket): no second staging folder.
    staging = shards.claim_staging(cfg.job.lease_ttl_s)
    try:
        return _prepare(cfg, checked, shards, staging, timer, group, device, stop)
    except BaseException:
        if staging is not None:
            staging.release()
        raise


def _prepare(cfg: GenerateConfig, checked: Checked, shards: LocalShards, staging: Optional[StagingClaim],
             timer: StageTimer, group: Group, device: torch.device, stop: Optional[StopFlag]) -> Prepared:
    topo, output_dir = group.topo, checked.output_dir
    held = {}
    with timer("plan"):
        # Rank 0 joins or makes the plan (other jobs on output_dir wait on its lock); the other
        # ranks read what it settled.
        owner = f"{HOST}:{os.getpid()}:part{topo.part}/{topo.parts}"

        def join_or_make() -> None:
            manifest = held["manifest"] = join_or_make_plan(cfg, shards, checked.divisor)
            leaser = Leaser(output_dir / PLAN_DIR, owner, cfg.job.lease_ttl_s)
            _report(recheck_done_units(manifest, output_dir / PLAN_DIR, shards, leaser, run_id(output_dir),
                                       full=cfg.job.verify == "full"), output_dir)

        group.agree(join_or_make, leader_only=True)
    plan_dir = output_dir / PLAN_DIR
    manifest = held.get("manifest") or read_manifest(plan_dir)
    leaser = Leaser(plan_dir, owner, cfg.job.lease_ttl_s, staging)
    sink = UnitSink(output_dir, cfg.sink, plan_dir, leaser, owner, shards, run=run_id(output_dir))
    order = PlanSettings(batch_sizes=list(cfg.bcg.batch_sizes), pad_short=cfg.bcg.pad_short_batches,
                      dtype=cfg.model.dtype, part=topo.part, wait=cfg.job.wait_for_leases, verify=cfg.job.verify)
    plan = LeasedPlan(manifest, plan_dir, leaser, sink, order, stop)
    return Prepared(cfg=cfg, family=checked.family, padder=checked.padder, output_dir=output_dir, plan=plan,
                    manifest=manifest, sink=sink, topo=topo, device=device, staging=staging)


def _report(check: Recheck, output_dir: Path) -> None:
    if check.reopened:
        log.warning("resume: %d of %d done unit(s) no longer held what they committed and were reopened (%s); "
                    "%d shard(s) moved to %s/_quarantine/ (listed in summary.json): %s", len(check.reopened),
                    check.checked, ", ".join(map(str, check.reopened[:10])), len(check.quarantined), output_dir,
                    ", ".join(q["url"] for q in check.quarantined[:10]) or "none")
    elif check.checked:
        log.info("resume: the shards of %d done unit(s) are as committed", check.checked)
