"""The resume scan of a writer that owns a name pattern: adopt only what it committed itself.

`scan_output` (sinks/manifest.py) serves any folder of shards, and rebuilds a manifest from a tar
that has none. A writer that owns a pattern (a job's work unit, `shard-u0000042-*.tar`) knows more,
and trusts less:

- its manifests are written before their tars (sinks/shard_writer.py), so a tar without a manifest
  was never its commit: left alone (a stray, named in the result), never adopted;
- a manifest of another run (`ShardRecord.run`) is another run's: left alone, never adopted;
- a manifest whose tar is gone (deleted, or a commit cut short) is moved to `_quarantine/`;
- a shard is adopted only when it matches its manifest (`verify`), its manifest's keys are
  consistent with its members, every key is one the owner may write, and no key is in a shard
  adopted before it. Anything else is moved to `_quarantine/` with its sidecars and manifest, and
  its samples are the owner's to generate again.

`staged=True` is an object store's staging folder: there a manifest without its tar is normal (the
shard was uploaded, then its local payload removed; sinks/remote.py settles those).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, List, Optional, Set

from sinks.keys import member_stem
from sinks.manifest import (
    ScanResult,
    ShardRecord,
    _quarantine_orphans,
    _settle_sidecars,
    current_stamps,
    is_shard_name,
    load_manifest,
    remove_temps,
    verify_shard,
    write_manifest,
)
from sinks.names import MANIFEST_DIR
from sinks.quarantine import quarantine, quarantine_file
from sinks.sidecars import MetaSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ownership:
    """What a scanning writer owns: its run id, and the keys its pattern's shards may hold.
    `earlier`: ids the same run had before (an extended run's manifests keep the id they were
    committed under): shards carrying one are the run's too."""

    run: str
    keys: AbstractSet[str]
    earlier: AbstractSet[str] = frozenset()


def ownership_problems(record: ShardRecord, owner: Ownership, taken: Set[str]) -> List[str]:
    """Why the record is not a shard `owner` committed ([] when it is): keys it may not write, keys
    already in another adopted shard, or keys that are not the ones its members are named by."""
    problems = []
    foreign = [k for k in record.keys if k not in owner.keys]
    if foreign:
        problems.append(f"its manifest lists {len(foreign)} key(s) this unit does not have, e.g. {foreign[0]!r}")
    twice = [k for k in record.keys if k in taken]
    if twice:
        problems.append(f"{len(twice)} of its key(s) are already in another shard, e.g. {twice[0]!r}")
    if record.members:
        stems: List[str] = []
        for name, _ in record.members:
            stem = name.split(".", 1)[0]
            if not stems or stems[-1] != stem:
                stems.append(stem)
        if stems != [member_stem(k) for k in record.keys]:
            problems.append("its manifest's keys are not the ones its members are named by (the manifest was edited)")
    return problems


def is_foreign(record: ShardRecord, owner: Ownership) -> bool:
    """A manifest of another run: not the owner's to adopt, nor to move."""
    return bool(owner.run and record.run and record.run != owner.run and record.run not in owner.earlier)


def scan_owned(output_dir: Path, pattern_glob: str, verify: str, spec: Optional[MetaSpec], owner: Ownership,
               staged: bool = False) -> ScanResult:
    """The owner's committed shards matching `pattern_glob` (see the module docstring). Run it
    only while no other writer of the pattern is alive (the caller holds the names' lease)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return ScanResult([], [])
    result = ScanResult([], remove_temps(output_dir, pattern_glob))
    tars = {p.name for p in output_dir.glob(pattern_glob)}
    manifests = {p.name[: -len(".json")] for p in (output_dir / MANIFEST_DIR).glob(f"{pattern_glob}.json")}
    taken: Set[str] = set()
    for url in sorted(manifests):
        if url not in tars:
            if not staged:
                entry = quarantine_file(output_dir, f"{MANIFEST_DIR}/{url}.json",
                                        f"its shard {url} is not in output_dir")
                if entry is not None:
                    result.quarantined.append(entry)
            continue
        record = _adopt(output_dir, url, verify, spec, owner, taken, result)
        if record is not None:
            result.records.append(record)
            taken.update(record.keys)
    for name in sorted(tars - manifests):
        log.warning("%s has no manifest: this job never committed it (its manifests are written before their "
                    "shards), so it is left alone and never indexed; move it out of %s", name, output_dir)
        result.strays.append(name)
    if spec is not None:
        _quarantine_orphans(output_dir, pattern_glob, result)
    result.records.sort(key=lambda r: r.url)
    return result


def _adopt(output_dir: Path, url: str, verify: str, spec: Optional[MetaSpec], owner: Ownership, taken: Set[str],
           result: ScanResult) -> Optional[ShardRecord]:
    record = load_manifest(output_dir, url)
    if record is None:
        problems = ["its manifest is unreadable"]
    elif is_foreign(record, owner):
        log.warning("%s: its manifest is another run's (run %s, this run is %s): left alone, never indexed; move it "
                    "and _manifest/%s.json out of %s", url, record.run, owner.run, url, output_dir)
        result.strays.append(url)
        return None
    elif not is_shard_name(url):
        problems = ["not a shard name this package writes"]
    else:
        problems = verify_shard(output_dir, record, verify) or ownership_problems(record, owner, taken)
    if problems:
        entry = quarantine(output_dir, url, "; ".join(problems), None if record is None else record.nsamples)
        if entry is not None:
            result.quarantined.append(entry)
        return None
    assert record is not None  # an unreadable manifest is a problem above
    if _settle_sidecars(output_dir, record, verify, True, spec):
        record.stamps = current_stamps(output_dir, record)
        write_manifest(output_dir, record)
        result.rebuilt.append(url)
    return record
