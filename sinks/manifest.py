"""Per-shard manifests and the resume scan.

A manifest records the facts of one committed shard (`ShardRecord`: keys, size, sha256, member
names and sizes), kept in `OUTPUT_DIR/_manifest/NAME.json` and written atomically right after the
shard's commit. It is the witness of what was committed: a shard that no longer matches it was
changed afterwards, and is moved to `_quarantine/` (sinks/tar_check.py, sinks/quarantine.py) so its
samples are generated again. A manifest that is missing (a crash between commit and manifest
write) or unreadable (its own digest, from version 5, included) is rebuilt from the tar, if the tar
has the layout every shard has; where the shard must be its run's own (sinks/owned_scan.py), it is
quarantined instead.
The `_manifest/` folder keeps output_dir's `shard-*.tar` listing to shards only.

`scan_output` is the resume entry point. It deletes the temp files (`.NAME.tmp`) that match its
pattern. Run it before any writer of that pattern starts, or give each rank its own pattern:
the scan cannot tell a dead run's temp from a live writer's. The index is built from manifests
only (`indexed_records`): a `.tar` without one (a copy of a shard, say) is never indexed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from sinks.atomic import atomic_write_bytes, fsync_dir, link_no_replace, temp_path_for, write_synced
from sinks.errors import CorruptShardError
from sinks.keys import key_from_stem
from sinks.names import MANIFEST_DIR
from sinks.sidecars import MetaSpec
from sinks.tar_check import check_against_manifest, check_layout, sha256_file

log = logging.getLogger(__name__)

# 2 added `members`, 3 `sidecars`, 4 `run` and `stamps`, 5 its own `digest`; versions 1 to 4 are still read
MANIFEST_VERSION = 5
DIGEST_KEY = "digest"
# The names this package's writers give shards (DEFAULT_NAME_PATTERN, or one per rank, shard-rPPPP-NNNNNN):
# a file matching a shard glob but not this (`shard-000001 (copy).tar`) is a stray, never adopted.
# u: a work unit's (jobs/worker/).
SHARD_NAME = re.compile(r"shard-(?:(?:r[0-9]{4}-)?[0-9]{6,}|u[0-9]{7}-[0-9]{4,})\.tar")


@dataclass
class ShardRecord:
    """What resume and the wids index need to know about one committed shard."""

    url: str
    """The shard's file name, relative to output_dir."""
    nsamples: int
    filesize: int
    sha256: str
    keys: list[str] = field(default_factory=list)
    """Original sample keys, in shard order."""
    members: list[list] = field(default_factory=list)
    """[member name, payload size] of every tar member, in order: checked against the tar headers."""
    sidecars: list[list] = field(default_factory=list)
    """[name, size, sha256] of the shard's parquet and stats (sinks/sidecars.py), beside it in output_dir."""
    run: str = ""
    """The writer's run id (a job's: a digest of its run.json): a scan that owns the name adopts the
    shard only when it is its own run's. Empty: written before run ids, or by a writer without one."""
    stamps: dict = field(default_factory=dict)
    """{file name: stamp} of the tar and sidecars as committed (local: mtime in ns; an object store:
    the object's ETag): a stat or a listing then tells a file rewritten since, at the same size."""


@dataclass
class ScanResult:
    records: list[ShardRecord]
    """Committed shards, sorted by url."""
    removed_temps: list[str]
    """Temp files (partial shards or manifests) deleted, relative to output_dir."""
    rebuilt: list[str] = field(default_factory=list)
    """Urls whose manifest was missing or unreadable and was rebuilt from the tar."""
    quarantined: list[dict] = field(default_factory=list)
    """Shards that did not match their manifest (or were not readable shards), moved to _quarantine/."""
    strays: list[str] = field(default_factory=list)
    """Files matching the glob that are not shard names this package writes: left alone, not indexed."""


def manifest_path(output_dir: Path, url: str) -> Path:
    return Path(output_dir) / MANIFEST_DIR / f"{url}.json"


def write_manifest(output_dir: Path, record: ShardRecord, exclusive: bool = False, temp_tag: str = "") -> None:
    """Write the record's manifest atomically; `exclusive`: only if no manifest has that name
    (FileExistsError otherwise: another writer's, never overwritten)."""
    path = manifest_path(output_dir, record.url)
    path.parent.mkdir(exist_ok=True)
    body = {"manifest_version": MANIFEST_VERSION, **asdict(record)}
    body[DIGEST_KEY] = self_digest(body)
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    if not exclusive:
        atomic_write_bytes(path, data)
        return
    tmp = temp_path_for(path, temp_tag or str(os.getpid()))
    try:
        write_synced(tmp, data)
        link_no_replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def self_digest(body: dict) -> str:
    """sha256 of a JSON record's body, its own `digest` left out, in one canonical form: what a manifest,
    and a done marker (jobs/output/done.py), carry to tell a flipped bit that still parses."""
    rest = {k: v for k, v in body.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode("utf-8")).hexdigest()


def load_manifest(output_dir: Path, url: str) -> ShardRecord | None:
    """The manifest's record as written, or None when it is missing or unreadable: not JSON, not a
    record, or (from version 5) its own digest does not match, so a flipped bit in any field (a member's
    name, a key, the run id) that still parses is not taken for a fact. Whether the shard still matches
    it is `verify_shard`'s question."""
    path = manifest_path(output_dir, url)
    try:
        data = json.loads(path.read_bytes())
        # Checks, not asserts: `python -O` must not take a damaged manifest for the facts.
        digest = data.pop(DIGEST_KEY, None)
        if digest is not None and digest != self_digest(data):
            raise ValueError("its own digest does not match: damaged")
        if data.pop("manifest_version") not in (1, 2, 3, 4, MANIFEST_VERSION):
            raise ValueError("a manifest_version this bcgen does not know")
        record = ShardRecord(**data)
        if record.url != url or record.nsamples != len(record.keys):
            raise ValueError(f"it names {record.url} with {record.nsamples} samples and {len(record.keys)} keys")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        log.warning("manifest %s is unreadable (%s); rebuilding it from the shard", path, err or type(err).__name__)
        return None
    return record


def verify_shard(output_dir: Path, record: ShardRecord, level: str = "members") -> list[str]:
    """What differs between the shard and its manifest record ([] when it matches)."""
    return check_against_manifest(Path(output_dir) / record.url, record.filesize, record.members, record.sha256, level,
                                  record.stamps.get(record.url))


def current_stamps(output_dir: Path, record: ShardRecord) -> dict:
    """{name: stamp} of the record's tar and sidecars as they are now (after a rebuild)."""
    from sinks.tar_check import file_stamp

    names = [record.url] + [s[0] for s in record.sidecars]
    return {n: file_stamp(os.stat(Path(output_dir) / n)) for n in names if (Path(output_dir) / n).exists()}


def _stem_of(member_name: str) -> str:
    return member_name.split(".", 1)[0]


def record_from_tar(output_dir: Path, url: str) -> ShardRecord:
    """Rebuild a shard's record by reading the tar: keys from each sample's json. Raises
    CorruptShardError when the file does not have a complete shard's layout."""
    record, problems = _read_tar_record(Path(output_dir) / url)
    if problems:
        raise CorruptShardError(
            f"{Path(output_dir) / url} cannot be read as a shard ({'; '.join(problems)}). Interrupted runs never leave "
            f"a partial file under a final name, so it was damaged afterwards: move it aside and rerun to regenerate "
            f"its samples.")
    assert record is not None  # _read_tar_record gives a record whenever it finds no problem
    return record


def _read_tar_record(path: Path) -> tuple[Optional[ShardRecord], list[str]]:
    url = path.name
    stems: list[str] = []
    keys: dict[str, str] = {}
    members: list[list] = []
    problems = check_layout(path)
    try:
        if not problems:
            with tarfile.open(path, mode="r:") as tar:
                for member in tar:
                    stem = _stem_of(member.name)
                    members.append([member.name, member.size])
                    if not stems or stems[-1] != stem:
                        stems.append(stem)
                    if member.name == f"{stem}.json":
                        f = tar.extractfile(member)
                        # A shard's json members are regular files (TarShard writes no other kind).
                        assert f is not None, member.name
                        keys[stem] = json.loads(f.read())["key"]
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as err:
        problems.append(f"{type(err).__name__}: {err}")
    if problems:
        return None, problems
    ordered = [keys[stem] if stem in keys else key_from_stem(stem) for stem in stems]
    return ShardRecord(url, len(ordered), path.stat().st_size, sha256_file(path), ordered, members), []


def read_record(output_dir: Path, url: str) -> ShardRecord:
    """A committed shard's record, read-only: the manifest, or the tar itself when the manifest is
    missing. Writes nothing, so it is safe while other writers are alive."""
    return load_manifest(output_dir, url) or record_from_tar(output_dir, url)


def checked_record(output_dir: Path, url: str, level: str, quarantined: list, rebuilt: Optional[list] = None,
                   spec: Optional[MetaSpec] = None) -> Optional[ShardRecord]:
    """The record of a shard that still matches its manifest (or, without one, has a shard's layout);
    None after moving a shard that does not to _quarantine/ (its entry appended to `quarantined`).
    `rebuilt` given: a missing or unreadable manifest is rewritten from the tar and the url appended,
    sidecars found beside a shard without a manifest are adopted, and with a `spec` (the parquet's
    columns) sidecars that are missing or differ from the manifest are rebuilt from the tar."""
    from sinks.quarantine import quarantine

    record = load_manifest(output_dir, url)
    has_manifest = record is not None
    if record is not None:
        problems = verify_shard(output_dir, record, level)
    else:
        record, problems = _read_tar_record(Path(output_dir) / url)
    if problems:
        entry = quarantine(output_dir, url, "; ".join(problems), None if record is None else record.nsamples)
        if entry is not None:
            quarantined.append(entry)
        return None
    assert record is not None  # _read_tar_record gives a record whenever it finds no problem
    if rebuilt is None:
        return record
    changed = _settle_sidecars(output_dir, record, level, has_manifest, spec) or not has_manifest
    if changed:
        record.stamps = current_stamps(output_dir, record)
        write_manifest(output_dir, record)
        rebuilt.append(url)
    return record


def _settle_sidecars(output_dir: Path, record: ShardRecord, level: str, has_manifest: bool,
                     spec: Optional[MetaSpec]) -> bool:
    """Make the sidecars of a good shard match its record; True when the record's list changed.
    Sidecars found beside a shard without a manifest are adopted when they match it; without a
    `spec` nothing is rebuilt."""
    from sinks import sidecars

    if has_manifest and record.sidecars:
        problems = sidecars.check_sidecars(output_dir, record.sidecars, level, record.stamps)
        if not problems or spec is None:
            return False
        log.warning("%s: %s; rebuilding its parquet and stats from the shard", record.url, "; ".join(problems))
    elif not has_manifest:
        found = sidecars.adopt(output_dir, record.url, record.keys)
        if found is not None:
            record.sidecars = found
            return True
    if spec is None:
        return False
    record.sidecars = sidecars.rebuild(output_dir, record.url, record.filesize, spec)
    return True


def remove_temps(output_dir: Path, pattern_glob: str) -> list[str]:
    """Delete the temp files of shards, their sidecars and manifests matching `pattern_glob` (no live
    writer may own them)."""
    from sinks.sidecars import sidecar_globs

    removed = []
    # `.NAME.tmp` and a writer's tagged `.NAME.TAG.tmp` (sinks/atomic.py temp_path_for)
    globs = [(output_dir, f".{g}.*tmp") for g in (pattern_glob, *sidecar_globs(pattern_glob))]
    for directory, glob in globs + [(output_dir / MANIFEST_DIR, f".{pattern_glob}.json.*tmp")]:
        for path in sorted(directory.glob(glob)):
            path.unlink(missing_ok=True)
            removed.append(str(path.relative_to(output_dir)))
            log.info("removed partial file %s left by an interrupted run", path)
    return removed


def is_shard_name(name: str) -> bool:
    return SHARD_NAME.fullmatch(name) is not None


def scan_output(output_dir: str | Path, pattern_glob: str = "shard-*.tar", verify: str = "members",
                spec: Optional[MetaSpec] = None) -> ScanResult:
    """Committed shards under output_dir matching `pattern_glob`, after deleting leftover temps.

    Every shard is checked against its manifest (`verify`: members = size + tar headers, one stat
    and a header read per member; full = also sha256, reads every byte); one that differs is moved
    to _quarantine/ and left out, so its samples are generated again. With `spec`, each kept shard's
    parquet and stats are checked too (rebuilt from the tar when missing or changed), and sidecars
    whose shard is gone are moved to _quarantine/.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return ScanResult([], [])
    removed = remove_temps(output_dir, pattern_glob)
    result = ScanResult([], removed)
    for path in sorted(output_dir.glob(pattern_glob)):
        if not is_shard_name(path.name):
            log.warning("%s matches %s but is not a shard name this job writes (a copy?): left alone, never indexed; "
                        "move it out of output_dir", path, pattern_glob)
            result.strays.append(path.name)
            continue
        record = checked_record(output_dir, path.name, verify, result.quarantined, result.rebuilt, spec)
        if record is not None:
            result.records.append(record)
    if spec is not None:
        _quarantine_orphans(output_dir, pattern_glob, result)
    return result


def _quarantine_orphans(output_dir: Path, pattern_glob: str, result: ScanResult) -> None:
    """Sidecars whose shard is not there (deleted by hand): a parquet must not describe missing samples."""
    from sinks.quarantine import quarantine_file
    from sinks.sidecars import PARQUET_SUFFIX, STATS_SUFFIX, sidecar_globs

    for glob in sidecar_globs(pattern_glob):
        for path in sorted(output_dir.glob(glob)):
            suffix = PARQUET_SUFFIX if path.name.endswith(PARQUET_SUFFIX) else STATS_SUFFIX
            shard = path.name[: -len(suffix)] + ".tar"
            if is_shard_name(shard) and not (output_dir / shard).exists():
                entry = quarantine_file(output_dir, path.name, f"its shard {shard} is not in output_dir")
                if entry is not None:
                    result.quarantined.append(entry)


def indexed_records(output_dir: str | Path) -> list[ShardRecord]:
    """What the index lists: every manifest whose shard exists with the size it records, by url.
    Any other `.tar` in output_dir gets a warning and stays out of the index."""
    output_dir = Path(output_dir)
    records = {}
    for path in sorted((output_dir / MANIFEST_DIR).glob("*.tar.json")):
        url = path.name[: -len(".json")]
        record = load_manifest(output_dir, url)
        shard = output_dir / url
        if record is not None and shard.is_file() and shard.stat().st_size == record.filesize:
            records[url] = record
    for path in sorted(output_dir.glob("*.tar")):
        if path.name not in records:
            log.warning("%s has no manifest, so it is not indexed: a stray file (a copy of a shard?) or a shard whose "
                        "writer died before writing its manifest (rerun the job to check and adopt it)", path)
    return [records[url] for url in sorted(records)]
