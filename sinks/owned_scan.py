"""The resume scan of a writer that owns a name pattern: adopt only what it committed itself.

`scan_output` (sinks/manifest.py) serves any folder of shards, and rebuilds a manifest from a tar
that has none. A writer that owns a pattern (a job's work unit, `shard-u0000042-*.tar`) knows more,
and trusts less:

- its manifests are written before their tars (sinks/shard_writer.py), so a tar under one of its
  names without a manifest is not a commit it can vouch for, unless the owner holds a witness of it
  (`Ownership.witnessed`: the unit's done marker lists the shard) and the tar is byte for byte what
  was committed (size, sha256, members): then its manifest is restored and the shard adopted. One
  that holds keys of the owner's and no witness (its manifest deleted, or a copy dropped in) is moved
  to `_quarantine/` with its sidecars: those keys are generated again, and a glob of the folder would
  read them twice. One with none of its keys is another run's: left alone (a stray), never adopted;
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import AbstractSet, List, Mapping, Optional, Set

from sinks.keys import member_stem
from sinks.manifest import (
    ScanResult,
    ShardRecord,
    _quarantine_orphans,
    _read_tar_record,
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
    # {url: record} of shards the owner knows it committed (a done marker lists them, keys left out):
    # a tar whose manifest is gone is adopted when it matches its record
    witnessed: Mapping[str, ShardRecord] = field(default_factory=dict)


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
        record = _restore(output_dir, name, verify, spec, owner, taken, result)
        if record is not None:
            result.records.append(record)
            taken.update(record.keys)
    if spec is not None:
        _quarantine_orphans(output_dir, pattern_glob, result)
    result.records.sort(key=lambda r: r.url)
    return result


def _restore(output_dir: Path, url: str, verify: str, spec: Optional[MetaSpec], owner: Ownership, taken: Set[str],
             result: ScanResult) -> Optional[ShardRecord]:
    """A tar matching the owner's pattern without a manifest (see the module docstring): its manifest
    restored where the owner witnessed its commit and the tar is still what was committed; moved to
    _quarantine/ where it is under a shard name and holds keys the owner generates again; else left alone."""
    if not is_shard_name(url):
        _stray(output_dir, url, "its name is not one this package gives shards (a copy?)", result)
        return None
    witness = owner.witnessed.get(url)
    found, problems = _read_tar_record(output_dir / url)
    if witness is None:
        ours = [k for k in found.keys if k in owner.keys] if found is not None and not problems else []
        if not ours:
            _stray(output_dir, url, "it holds none of this unit's keys", result)
            return None
        problems = [f"it has no manifest, so this run cannot vouch for it, and it holds {len(ours)} of this unit's "
                    f"keys (e.g. {ours[0]!r}), generated again: left here, a glob of the folder would read them twice"]
    elif found is not None and not problems:
        if [found.filesize, found.sha256, found.members] != [witness.filesize, witness.sha256, witness.members]:
            problems = ["its manifest is missing, and it is not what its done marker says was committed"]
        else:
            # a marker's stamps add its manifest's own, which a manifest does not list (it is written anew)
            stamps = {k: v for k, v in witness.stamps.items() if not k.startswith(f"{MANIFEST_DIR}/")}
            found = replace(witness, keys=found.keys, stamps=stamps)
            problems = ownership_problems(found, owner, taken)
    if problems:
        entry = quarantine(output_dir, url, "; ".join(problems), None if found is None else found.nsamples)
        if entry is not None:
            result.quarantined.append(entry)
        return None
    assert found is not None  # _read_tar_record gives a record whenever it finds no problem
    if _settle_sidecars(output_dir, found, verify, True, spec):
        found.stamps = current_stamps(output_dir, found)
    write_manifest(output_dir, found)
    result.rebuilt.append(url)
    log.warning("%s: its manifest was missing; the shard is byte for byte what its done marker says was committed "
                "(size, sha256, members), so its manifest is restored and its samples kept", url)
    return found


def _stray(output_dir: Path, url: str, why: str, result: ScanResult) -> None:
    """Not this run's (another run's shard, a copy, a file that is not a shard): left alone, never indexed."""
    log.warning("%s has no manifest: not this run's to adopt (its manifests are written before their shards), and "
                "%s, so it is left alone and never indexed; move it out of %s", url, why, output_dir)
    result.strays.append(url)


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
