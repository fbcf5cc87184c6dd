"""The Ray job's summary: the actors' JobStats merged, the index of every done unit, summary.json.

The actors return their stats from run(), so nothing is merged through files. An actor that died
returns nothing: its completed units still count (their items from the units' reports), and the
job's status is the job's, not the worst actor's: complete once every unit is done, whatever died
on the way. `ray` in summary.json lists every actor (part, slot, finished or died, units, items)
and the units handed out again after a death.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from jobs.cluster.pool import PoolResult
from jobs.output.claim import dir_lock
from jobs.output.done import done_records
from jobs.output.layout import PLAN_DIR, SUMMARY_FILE
from jobs.output.mirror import LocalShards, Mirror
from jobs.plan.units import PlanManifest
from jobs.telemetry.parts import merge_stats
from jobs.telemetry.summary import JobStats
from sinks import write_wids_index
from sinks.atomic import atomic_write_bytes
from sinks.quarantine import quarantine_log


def merge(result: PoolResult, manifest: PlanManifest, done_at_start: int, stage_seconds: dict, status: str,
          model: str, shown: str) -> JobStats:
    records: List[dict] = result.records
    merged = merge_stats(records, len(records)) if records else JobStats()
    dead = [a for a in result.actors if a["status"] == "died"]
    merged.items_written += sum(a["items_written"] for a in dead)
    merged.items_planned += sum(a["items_written"] for a in dead)
    merged.items_skipped_done += done_at_start  # done units count once, here, as part 0 does on HPC
    merged.bad_rows = manifest.dataset["bad_rows"]
    merged.stage_seconds.update(stage_seconds)  # the driver's own stages (plan)
    merged.status, merged.model, merged.output_dir = status, model, shown
    return merged


def write_summary(out: Path, shards: LocalShards, merged: JobStats, ray_block: dict) -> None:
    """Index and summary.json from the done markers; with an object store, every node's markers are
    fetched first and the results uploaded after (jobs/output/mirror.py)."""
    with dir_lock(out, "finish"):
        if isinstance(shards, Mirror):
            with dir_lock(out, "mirror"):
                shards.hydrate(overwrite=False)  # fetches the done markers the actors uploaded
        write_wids_index(out, done_records(out / PLAN_DIR))
        data = merged.to_json()
        data["quarantined"] = quarantine_log(out)
        data["ray"] = ray_block
        atomic_write_bytes(out / SUMMARY_FILE, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
        shards.push_end(leader=True)


def ray_block(result: PoolResult, address: str, workers: int) -> dict:
    return {"address": address, "workers": workers, "actors": sorted(result.actors, key=lambda a: a["part"]),
            "deaths": sum(1 for a in result.actors if a["status"] == "died"), "units_redone": sorted(result.redone)}
