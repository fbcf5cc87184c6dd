"""Done markers: `_plan/done/unit-NNNNNNN.json`, written once a unit's shards are all committed.

Resume is a set difference, as in img2dataset's done_shards: the units of plan.json minus the
names in `_plan/done/`. One directory listing, no scan of shards. A marker lists the unit's
shard records (url, samples, bytes, sha256), so the final wids index is built from the markers.
It is published with a hard link, so a unit is marked done once even if two workers race.

A marker carries the sha256 of its own body (`digest`): resume reads markers and trusts their sizes
and stamps, and a flipped bit in a shard's recorded sha256 would otherwise pass into the index. A
marker whose digest does not match is read as damaged (`read_marker`: None), as an unparsable one
is; the resume check rewrites it from the shards' manifests (jobs/worker/recheck.py). Markers
written before the digest have none and are read as they are.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Set

from jobs.output.layout import DONE_DIR, unit_name
from sinks.atomic import fsync_dir, write_synced
from sinks.manifest import DIGEST_KEY, ShardRecord, self_digest

log = logging.getLogger(__name__)


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
    body[DIGEST_KEY] = self_digest(body)
    try:
        write_synced(tmp, json.dumps(body).encode())
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(d)
    return True


def read_marker(path: Path) -> Optional[dict]:
    """A done marker's body; None where it is unreadable, not a marker, or its digest does not match."""
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("shards"), list):
        return None
    if DIGEST_KEY in body and body[DIGEST_KEY] != self_digest(body):
        return None
    return body


def marker_records(plan_dir: Path, unit: int) -> Optional[List[ShardRecord]]:
    """The shards a done marker lists; None when the marker is unreadable or damaged."""
    body = read_marker(done_path(plan_dir, unit))
    try:
        return None if body is None else [ShardRecord(**s) for s in body["shards"]]
    except TypeError:  # a record of other fields
        return None


def done_records(plan_dir: Path) -> List[ShardRecord]:
    """Every done unit's shard records, in unit order (for the wids index). A marker damaged since the resume
    check (which rewrote every damaged one) is left out with a warning: the index then misses its shards,
    which `jobs.verify` reports and a plain rerun mends."""
    out = []
    for unit in sorted(done_units(plan_dir)):
        records = marker_records(plan_dir, unit)
        if records is None:
            log.warning("%s is damaged: its shards are left out of the index (a plain rerun rewrites it)",
                        done_path(plan_dir, unit))
            continue
        out += records
    return out
