"""Per-shard manifests and the resume scan.

A manifest is a cache of facts about one committed shard (`ShardRecord`), kept in
`OUTPUT_DIR/_manifest/NAME.json` and written atomically right after the shard's commit. The shard
tar at its final name is the truth: a manifest that is missing (a crash between commit and
manifest write), unreadable, or disagrees with the file's size is rebuilt by reading the tar.
The `_manifest/` folder keeps output_dir's `shard-*.tar` listing to shards only.

`scan_output` is the resume entry point. It deletes the temp files (`.NAME.tmp`) that match its
pattern. Run it before any writer of that pattern starts, or give each rank its own pattern:
the scan cannot tell a dead run's temp from a live writer's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sinks.atomic import atomic_write_bytes
from sinks.errors import CorruptShardError
from sinks.keys import key_from_stem

log = logging.getLogger(__name__)

MANIFEST_DIR = "_manifest"
MANIFEST_VERSION = 1


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


@dataclass
class ScanResult:
    records: list[ShardRecord]
    """Committed shards, sorted by url."""
    removed_temps: list[str]
    """Temp files (partial shards or manifests) deleted, relative to output_dir."""
    rebuilt: list[str] = field(default_factory=list)
    """Urls whose manifest was missing or stale and was rebuilt from the tar."""


def manifest_path(output_dir: Path, url: str) -> Path:
    return Path(output_dir) / MANIFEST_DIR / f"{url}.json"


def write_manifest(output_dir: Path, record: ShardRecord) -> None:
    path = manifest_path(output_dir, record.url)
    path.parent.mkdir(exist_ok=True)
    data = {"manifest_version": MANIFEST_VERSION, **asdict(record)}
    atomic_write_bytes(path, json.dumps(data, ensure_ascii=False).encode("utf-8"))


def load_manifest(output_dir: Path, url: str) -> ShardRecord | None:
    """The cached record, or None when it is missing, unreadable or disagrees with the shard."""
    path = manifest_path(output_dir, url)
    try:
        data = json.loads(path.read_bytes())
        assert data.pop("manifest_version") == MANIFEST_VERSION
        record = ShardRecord(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AssertionError) as err:
        log.warning("manifest %s is unreadable (%s); rebuilding it from the shard", path, err)
        return None
    shard_size = (Path(output_dir) / url).stat().st_size
    if record.url != url or record.filesize != shard_size or record.nsamples != len(record.keys):
        log.warning("manifest %s disagrees with %s; rebuilding it from the shard", path, url)
        return None
    return record


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stem_of(member_name: str) -> str:
    return member_name.split(".", 1)[0]


def record_from_tar(output_dir: Path, url: str) -> ShardRecord:
    """Rebuild a shard's record by reading the tar: keys from each sample's json."""
    path = Path(output_dir) / url
    stems: list[str] = []
    keys: dict[str, str] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                stem = _stem_of(member.name)
                if not stems or stems[-1] != stem:
                    stems.append(stem)
                if member.name == f"{stem}.json":
                    keys[stem] = json.loads(tar.extractfile(member).read())["key"]
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as err:
        raise CorruptShardError(
            f"{path} cannot be read as a shard ({type(err).__name__}: {err}). Interrupted runs never leave a partial "
            f"file under a final name, so it was damaged afterwards: move it aside and rerun to regenerate its samples."
        ) from err
    ordered = [keys[stem] if stem in keys else key_from_stem(stem) for stem in stems]
    return ShardRecord(url, len(ordered), path.stat().st_size, _sha256_file(path), ordered)


def read_record(output_dir: Path, url: str) -> ShardRecord:
    """A committed shard's record, read-only: the manifest, or the tar itself when the manifest is
    missing or stale. Writes nothing, so it is safe while other writers are alive."""
    return load_manifest(output_dir, url) or record_from_tar(output_dir, url)


def _remove_temps(output_dir: Path, pattern_glob: str) -> list[str]:
    removed = []
    for directory, glob in ((output_dir, f".{pattern_glob}.tmp"), (output_dir / MANIFEST_DIR, f".{pattern_glob}.json.tmp")):
        for path in sorted(directory.glob(glob)):
            path.unlink(missing_ok=True)
            removed.append(str(path.relative_to(output_dir)))
            log.info("removed partial file %s left by an interrupted run", path)
    return removed


def scan_output(output_dir: str | Path, pattern_glob: str = "shard-*.tar", verify: bool = False) -> ScanResult:
    """Committed shards under output_dir matching `pattern_glob`, after deleting leftover temps.

    `verify=True` rehashes every shard (reads all bytes); by default a manifest is trusted when
    its size matches the file, so a resume scan costs one stat and one small read per shard.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return ScanResult([], [])
    removed = _remove_temps(output_dir, pattern_glob)
    records, rebuilt = [], []
    for path in sorted(output_dir.glob(pattern_glob)):
        url = path.name
        record = load_manifest(output_dir, url)
        if record is not None and verify and record.sha256 != _sha256_file(path):
            log.warning("shard %s does not match its manifest's sha256; rebuilding the manifest", url)
            record = None
        if record is None:
            record = record_from_tar(output_dir, url)
            write_manifest(output_dir, record)
            rebuilt.append(url)
        records.append(record)
    return ScanResult(records, removed, rebuilt)
