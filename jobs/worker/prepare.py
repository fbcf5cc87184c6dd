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
from jobs.output.done import reopen_damaged
from jobs.output.layout import PLAN_DIR
from jobs.output.leases import HOST
from jobs.output.mirror import LocalShards, open_shards
from jobs.plan.publish import join_or_make_plan
from jobs.plan.units import PlanManifest, read_manifest
from jobs.preflight import check_config
from jobs.telemetry.summary import StageTimer
from jobs.worker.lease import Leaser
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


def prepare(cfg: GenerateConfig, timer: StageTimer, group: Group, device: torch.device,
            stop: Optional[StopFlag] = None) -> Prepared:
    checked = check_config(cfg)
    topo, output_dir = group.topo, checked.output_dir
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir, topo.task_count, cfg.dataset.keep_fields)
    held = {}
    with timer("plan"):
        # Rank 0 joins or makes the plan (other jobs on output_dir wait on its lock); the other
        # ranks read what it settled.
        def join_or_make() -> None:
            held["manifest"] = join_or_make_plan(cfg, shards, checked.divisor)
            if cfg.job.verify == "full":
                _reopen_damaged(output_dir, shards, cfg.job.verify)

        group.agree(join_or_make, leader_only=True)
    plan_dir = output_dir / PLAN_DIR
    manifest = held.get("manifest") or read_manifest(plan_dir)
    owner = f"{HOST}:{os.getpid()}:part{topo.part}/{topo.parts}"
    leaser = Leaser(plan_dir, owner, cfg.job.lease_ttl_s)
    sink = UnitSink(output_dir, cfg.sink, plan_dir, leaser, owner, shards)
    order = PlanSettings(batch_sizes=list(cfg.bcg.batch_sizes), pad_short=cfg.bcg.pad_short_batches,
                      dtype=cfg.model.dtype, part=topo.part, wait=cfg.job.wait_for_leases, verify=cfg.job.verify)
    plan = LeasedPlan(manifest, plan_dir, leaser, sink, order, stop)
    return Prepared(cfg=cfg, family=checked.family, padder=checked.padder, output_dir=output_dir, plan=plan,
                    manifest=manifest, sink=sink, topo=topo, device=device)


def _reopen_damaged(output_dir: Path, shards: LocalShards, verify: str) -> None:
    moved = reopen_damaged(output_dir / PLAN_DIR, shards, verify)
    if moved:
        log.warning("resume: %d committed shard(s) no longer match their manifests and were moved to "
                    "%s/_quarantine/ (listed in summary.json): %s; their units are reopened and their "
                    "samples generated again", len(moved), output_dir,
                    ", ".join(q["url"] for q in moved[:10]))
