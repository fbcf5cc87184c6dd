"""Done markers: `_plan/done/unit-NNNNNNN.json`, written once a unit's shards are all committed.

Resume is a set difference, as in img2dataset's done_shards: the units of plan.json minus the
names in `_plan/done/`. One directory listing, no scan of shards. A marker lists the unit's
shard records (url, samples, bytes, sha256), so the final wids index is built from the markers.
It is published with a hard link, so a unit is marked done once even if two workers race.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import List, Set

from jobs.output.layout import DONE_DIR, unit_name, unit_shard_glob
from sinks.atomic import fsync_dir, write_synced
from sinks.manifest import ShardRecord


def done_units(plan_dir: Path) -> Set[int]:
    d = plan_dir / DONE_DIR
    if not d.is_dir():
        return set()
    return {int(name[5:12]) for name in os.listdir(d) if name.startswith("unit-") and name.endswith(".json")}


def done_path(plan_dir: Path, unit: int) -> Path:
    return plan_dir / DONE_DIR / f"{unit_name(unit)}.json"


def mark_done(plan_dir: Path, unit: int, records: List[ShardRecord], owner: str) -> bool:
    """Publish the marker; False when the unit was already marked (by a worker it was taken from)."""
    d = plan_dir / DONE_DIR
    d.mkdir(exist_ok=True)
    path = d / f"{unit_name(unit)}.json"
    tmp = d / f".{path.name}.{os.getpid()}.tmp"
    body = {"unit": unit, "owner": owner, "items": sum(r.nsamples for r in records),
            "shards": [{k: v for k, v in asdict(r).items() if k != "keys"} for r in records]}
    try:
        write_synced(tmp, json.dumps(body).encode())
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(d)
    return True


def done_records(plan_dir: Path) -> List[ShardRecord]:
    """Every done unit's shard records, in unit order (for the wids index)."""
    out = []
    for unit in sorted(done_units(plan_dir)):
        body = json.loads((plan_dir / DONE_DIR / f"{unit_name(unit)}.json").read_text())
        out += [ShardRecord(**s) for s in body["shards"]]
    return out


def reopen_damaged(plan_dir: Path, shards, verify: str) -> List[dict]:
    """job.verify=full: check the shards of every done unit (a scan of all shards, so only on
    request; by default done units are trusted and resume reads no shard). A unit whose shard no
    longer matches its manifest (moved to _quarantine/ by the scan) or is missing loses its done
    marker, and its missing samples are generated again. Returns the quarantined shards.
    `shards`: jobs/output/mirror.py LocalShards or Mirror (an object store)."""
    quarantined: List[dict] = []
    for unit in sorted(done_units(plan_dir)):
        marker = done_path(plan_dir, unit)
        listed = {s["url"] for s in json.loads(marker.read_text())["shards"]}
        records, moved = shards.scan(unit_shard_glob(unit), verify)
        quarantined += moved
        if moved or not listed <= {r.url for r in records}:
            marker.unlink()
            shards.on_reopen(marker)
    return quarantined
