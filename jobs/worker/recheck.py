"""The resume check of done units: every rerun looks at what it trusts, at one stat a file.

A done unit is skipped by resume, so its shards must still be what its marker says was committed.
Before any unit is leased, the leader compares every done unit's marker with the files as they are
(`shards.facts()`: one listing of output_dir and a stat a file; on an object store one listing of
its shards and one of its manifests, whatever the run's size):

    each shard the marker lists:  tar, parquet and stats there, with their committed size;
                                  its manifest there; each file's stamp (mtime, or the object's
                                  ETag) as committed, else the unit is checked with sha256
    the marker itself:            readable, and its own digest matching (jobs/output/done.py)

A unit that fails is taken (its lease, so no live worker is writing it), scanned as a leased unit
is (sinks/owned_scan.py: damaged shards to _quarantine/, only this run's own shards adopted; a shard
whose manifest alone was deleted is adopted again when it is byte for byte what the marker lists), and
loses its done marker when a shard it listed is gone: its missing samples are generated again by
this run, like any unfinished unit. Where its shards are whole and hold every key of the unit but the
marker is not what they say (damaged, unreadable), the marker is rewritten from their manifests. What
this cannot see (a changed byte with the size and stamp kept) needs `job.verify=full`, which scans
every done unit so, with sha256.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Set, Tuple

from jobs.output.claim import run_lineage
from jobs.output.done import done_path, done_units, mark_done, marker_records
from jobs.output.layout import unit_name, unit_shard_glob
from jobs.output.mirror import LocalShards
from jobs.plan.units import PlanManifest, read_unit_keys
from jobs.worker.lease import Leaser
from sinks.manifest import ShardRecord
from sinks.names import MANIFEST_DIR
from sinks.owned_scan import Ownership

log = logging.getLogger("jobs.run")

Facts = Dict[str, Tuple[int, str]]  # {name: (size, stamp)} of shard files and `_manifest/NAME.json`


@dataclass
class Recheck:
    checked: int = 0  # done units looked at
    reopened: List[int] = field(default_factory=list)  # lost their marker: generated again
    quarantined: List[dict] = field(default_factory=list)
    skipped: List[int] = field(default_factory=list)  # leased by a live worker: left to it


def manifests_of(facts: FactDict) -> Dict[int, Set[str]]:
    """{unit: the shard urls its manifests name}, grouped once per check (a dict kept in `facts`)."""
    cached = getattr(facts, "_by_unit", None)
    if cached is None:
        cached = {}
        head = len(MANIFEST_DIR) + 1
        for name in facts:
            if name.startswith(f"{MANIFEST_DIR}/shard-u") and name.endswith(".tar.json"):
                url = name[head:-len(".json")]
                cached.setdefault(int(url[7:14]), set()).add(url)
        facts._by_unit = cached
    return cached


class FactDict(dict):
    """`facts` with room for its per-unit grouping."""

    _by_unit: Dict[int, Set[str]]  # set by manifests_of on first use


def stat_problems(records: List[ShardRecord], facts: FactDict, unit: int) -> Tuple[List[str], bool]:
    """(what differs, whether only a stamp moved: then sha256 decides)."""
    problems, moved = [], False
    for r in records:
        manifest = f"{MANIFEST_DIR}/{r.url}.json"
        if manifest not in facts:
            problems.append(f"{r.url}: its manifest is missing")
        for name, size in [(r.url, r.filesize)] + [(s[0], s[1]) for s in r.sidecars]:
            found = facts.get(name)
            if found is None:
                problems.append(f"{name} is missing")
            elif found[0] != size:
                problems.append(f"{name}: {found[0]} bytes, committed {size}")
        for name, stamp in r.stamps.items():
            if name in facts and facts[name][1] != stamp:
                moved = True
    extra = sorted(manifests_of(facts).get(unit, set()) - {r.url for r in records})
    if extra:
        problems.append(f"{MANIFEST_DIR}/{extra[0]}.json: a manifest its done marker does not list")
    return problems, moved and not problems


def recheck_done_units(manifest: PlanManifest, plan_dir: Path, shards: LocalShards, leaser: Leaser, run: str,
                       full: bool) -> Recheck:
    """Check every done unit (see the module docstring); `full` (job.verify=full): scan each with sha256."""
    out = Recheck()
    done = sorted(done_units(plan_dir))
    if not done:
        return out
    facts = FactDict(shards.facts())
    by_id = {u.id: u for u in manifest.units}
    for unit in done:
        if unit not in by_id:
            continue  # not this plan's (a stray marker): nothing resumes from it
        out.checked += 1
        records = marker_records(plan_dir, unit)
        if records is None:
            level, why = "members", "its done marker is unreadable or damaged"
        else:
            problems, moved = stat_problems(records, facts, unit)
            if not problems and not moved and not full:
                continue
            level = "full" if (moved or full) else "members"
            why = "; ".join(problems[:3]) or ("a file was rewritten since its commit (its stamp moved)" if moved
                                              else "job.verify=full")
        _reopen_if_damaged(unit, records, why, level, manifest, plan_dir, shards, leaser, run, out)
    return out


def _reopen_if_damaged(unit: int, records, why: str, level: str, manifest: PlanManifest, plan_dir: Path,
                       shards: LocalShards, leaser: Leaser, run: str, out: Recheck) -> None:
    if leaser.try_take(unit) is None:
        out.skipped.append(unit)
        log.warning("resume: done unit %d needs a check (%s), but a live worker holds its lease: left to it", unit, why)
        return
    try:
        shards.fetch_unit(plan_dir / f"{unit_name(unit)}.parquet")  # an object store: fetched when needed
        keys = read_unit_keys(plan_dir, next(u for u in manifest.units if u.id == unit))
        # the marker witnesses what the unit committed: a shard whose manifest alone is gone is adopted again
        witnessed = {r.url: r for r in records or []}
        kept, moved = shards.scan(unit_shard_glob(unit), level,
                                  Ownership(run, frozenset(keys), run_lineage(plan_dir.parent), witnessed))
        out.quarantined += moved
        listed = {r.url for r in records} if records is not None else None
        if listed is None and not moved and set(keys) <= {k for r in kept for k in r.keys}:
            listed = {r.url for r in kept}  # a damaged marker over whole shards: rewritten below, not reopened
        marker = done_path(plan_dir, unit)
        if moved or listed is None or not listed <= {r.url for r in kept}:
            marker.unlink(missing_ok=True)
            shards.on_reopen(marker)
            out.reopened.append(unit)
            log.warning("resume: done unit %d no longer holds what it committed (%s): reopened, its missing samples "
                        "are generated again", unit, why)
        elif records is None or _facts_of(shards.with_manifest_stamps(kept)) != _facts_of(records):
            # the shards are whole and the marker says otherwise: the marker is what changed
            marker.unlink(missing_ok=True)
            mark_done(plan_dir, unit, shards.with_manifest_stamps(kept), leaser.owner)
            shards.on_done(marker)
            # `why` is what sent the unit to this check, from before its scan (which may have put a missing
            # manifest back): the shards passed, so the message says so rather than repeat the symptom alone.
            log.warning("resume: done unit %d was checked (%s): its shards hold what it committed, and its done "
                        "marker is rewritten to record them as they are now", unit, why)
    finally:
        leaser.release(unit)


def _facts_of(records: List[ShardRecord]) -> List[dict]:
    """What a done marker says of its shards (it leaves the keys to the manifests)."""
    return sorted(({k: v for k, v in asdict(r).items() if k != "keys"} for r in records), key=lambda d: d["url"])
