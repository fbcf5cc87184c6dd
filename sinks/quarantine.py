"""Move a damaged committed shard (with its parquet, stats and manifest) aside, into `OUTPUT_DIR/_quarantine/`.

Moved, not deleted: the bytes may be worth a look, and nothing under `_quarantine/` matches a
shard glob, so no index, resume scan or `webdataset` glob of output_dir sees it again. Each move
appends one line to `_quarantine/log.jsonl` (url, where it went, why, how many samples), which
the job's summary.json repeats.

The sidecars move first and the tar after them: a move cut short leaves a shard without sidecars
(rebuilt, or quarantined again, by the next scan), never a parquet that describes a missing shard.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import List, Optional

from sinks.names import MANIFEST_DIR, QUARANTINE_DIR, QUARANTINE_LOG

log = logging.getLogger(__name__)


def _free_name(directory: Path, name: str) -> Path:
    path, n = directory / name, 1
    while path.exists():  # the same name was quarantined before (a regenerated shard damaged again)
        path, n = directory / f"{name}.{n}", n + 1
    return path


def quarantine(output_dir: Path, url: str, reason: str, nsamples: Optional[int]) -> Optional[dict]:
    """Move shard `url`, its sidecars and its manifest into _quarantine/; None when another process
    moved it first."""
    from sinks.sidecars import sidecar_names

    output_dir = Path(output_dir)
    target_dir = output_dir / QUARANTINE_DIR
    target_dir.mkdir(exist_ok=True)
    if not (output_dir / url).exists():
        return None  # a rank or array task checking the same shard moved it already
    target = _free_name(target_dir, url)
    # shard-X.parquet -> shard-X.tar.parquet, shard-X_stats.json -> shard-X.tar.stats.json
    for name in sidecar_names(url):
        try:
            os.replace(output_dir / name, target.with_name(target.name + "." + name[len(url) - 4:].lstrip("._")))
        except FileNotFoundError:
            pass
    try:
        os.rename(output_dir / url, target)
    except FileNotFoundError:
        return None
    manifest = output_dir / MANIFEST_DIR / f"{url}.json"
    if manifest.exists():
        os.replace(manifest, target.with_name(target.name + ".manifest.json"))
    entry = _log(output_dir, url, target, reason, nsamples)
    log.warning("shard %s does not match what was committed (%s): moved to %s; its %s sample(s) will be "
                "generated again", url, reason, entry["moved_to"], "?" if nsamples is None else nsamples)
    return entry


def quarantine_file(output_dir: Path, name: str, reason: str) -> Optional[dict]:
    """Move one file (a sidecar whose shard is gone) into _quarantine/."""
    output_dir = Path(output_dir)
    target_dir = output_dir / QUARANTINE_DIR
    target_dir.mkdir(exist_ok=True)
    target = _free_name(target_dir, Path(name).name)  # `_manifest/X.json` lands as `X.json`
    try:
        os.rename(output_dir / name, target)
    except FileNotFoundError:
        return None
    entry = _log(output_dir, name, target, reason, None)
    log.warning("%s: %s; moved to %s", name, reason, entry["moved_to"])
    return entry


def _log(output_dir: Path, url: str, target: Path, reason: str, nsamples: Optional[int]) -> dict:
    entry = {"url": url, "moved_to": str(target.relative_to(output_dir)), "reason": reason,
             "nsamples": nsamples, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    append_log(output_dir, entry)
    return entry


def append_log(output_dir: Path, entry: dict) -> None:
    """Add one entry to _quarantine/log.jsonl (also for shards moved aside on an object store)."""
    (Path(output_dir) / QUARANTINE_DIR).mkdir(exist_ok=True)
    # One short line: an atomic append.
    with open(Path(output_dir) / QUARANTINE_DIR / QUARANTINE_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def quarantine_log(output_dir: Path) -> List[dict]:
    """Every shard ever quarantined in output_dir, oldest first. A line that is not an entry (torn by a
    kill mid-append, damaged) is left out with a warning: the log is a record for a person, and the
    summary that repeats it must still be written."""
    path = Path(output_dir) / QUARANTINE_DIR / QUARANTINE_LOG
    if not path.exists():
        return []
    entries, bad = [], 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError both
            entry = None
        if isinstance(entry, dict):
            entries.append(entry)
        else:
            bad += 1
    if bad:
        log.warning("%s: %d line(s) are not entries (torn or damaged): left out of summary.json", path, bad)
    return entries
