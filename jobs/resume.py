"""Resume: what an output_dir already holds, and whether this run may add to it.

`run.json` records the identity of the run that owns the folder: the dataset's digest and every
config value that changes an item's bytes. A rerun with the same identity continues (committed
keys are skipped; temp files of torn shards are removed by the sink's scan); a different one is
refused, naming what differs, unless job.overwrite=true.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, List, Set

from jobs.config import GenerateConfig
from jobs.dataset import Record

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
OWNED = ("index.wids.json", "summary.json", "errors.jsonl", RUN_FILE)


def dataset_digest(records: Iterable[Record]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps([r.key, r.prompt, r.negative_prompt, r.seed, r.width, r.height, r.steps,
                             r.guidance_scale]).encode())
        h.update(b"\n")
    return h.hexdigest()


def run_identity(cfg: GenerateConfig, digest: str, n_records: int) -> dict:
    m = cfg.model
    return {
        "dataset": {"digest": digest, "records": n_records},
        "model": {"name": m.name, "family": m.family, "path": m.path, "dtype": m.dtype, "tiny": m.tiny,
                  "max_sequence_length": m.max_sequence_length,
                  "complex_human_instruction": m.complex_human_instruction},
        "text_buckets": cfg.text_buckets,
        "sampling": asdict(cfg.sampling),
        "sink": {"format": cfg.sink.format, "quality": cfg.sink.quality},
    }


def _differences(old: dict, new: dict, prefix: str = "") -> List[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {_short(a)} -> {_short(b)}")
    return out


def _short(v) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 80 else s[:77] + "..."


def open_run(output_dir: Path, identity: dict, overwrite: bool, shard_glob: str = "shard-*.tar") -> None:
    """Claim output_dir for this run, or refuse with what differs from the run that owns it."""
    run_file = output_dir / RUN_FILE
    shards = sorted(output_dir.glob(shard_glob))
    if run_file.exists():
        old = json.loads(run_file.read_text())
        diff = _differences(old, identity)
        if diff and not overwrite:
            raise ValueError(
                f"output_dir={str(output_dir)!r} holds a run with a different dataset or config:\n  "
                + "\n  ".join(diff[:20])
                + "\nUse another output_dir, or job.overwrite=true to delete its shards and start over.")
        if not diff:
            return
    elif shards and not overwrite:
        raise ValueError(f"output_dir={str(output_dir)!r} holds {len(shards)} shard(s) but no {RUN_FILE}: they were "
                         f"not written by this tool's run. Use another output_dir, or job.overwrite=true to delete them.")
    if overwrite:
        wipe(output_dir, shard_glob)
    from sinks.atomic import atomic_write_bytes

    atomic_write_bytes(run_file, (json.dumps(identity, indent=2, sort_keys=True, default=str) + "\n").encode())


def wipe(output_dir: Path, shard_glob: str) -> None:
    removed = 0
    for p in list(output_dir.glob(shard_glob)) + list(output_dir.glob("." + shard_glob + "*")):
        p.unlink()
        removed += 1
    for name in OWNED:
        (output_dir / name).unlink(missing_ok=True)
    manifest_dir = output_dir / "_manifest"
    if manifest_dir.is_dir():
        shutil.rmtree(manifest_dir)
    log.warning("job.overwrite=true: removed %d shard file(s) and the old run's index/summary in %s",
                removed, output_dir)


def committed_keys(output_dir: Path, shard_glob: str = "shard-*.tar") -> Set[str]:
    from sinks import scan_output

    scan = scan_output(output_dir, shard_glob)
    if scan.removed_temps:
        log.info("resume: removed %d torn shard temp file(s): %s", len(scan.removed_temps),
                 ", ".join(scan.removed_temps[:5]))
    keys: Set[str] = set()
    for rec in scan.records:
        keys.update(rec.keys)
    return keys


def check_writable(output_dir: Path) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"output_dir={str(output_dir)!r} is not writable ({e.strerror}); "
                         f"choose a directory you can write to") from e
