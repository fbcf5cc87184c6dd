"""The identity of the weights under `model.path`: what a run was made with, not only where it was.

    plan.json "weights": {"path": model.path, "digest": D, "files": [{"path": rel, "bytes", "mtime_ns", "digest"}]}
    run.json  model.weights: D          (a digest over every file's relative path and sha256)

The planner hashes every file a load can read (jobs/models/checkpoint.py: weight_files) once, in
threads side by side; a fresh run on files whose stat stamp (inode, size, mtime, ctime) is unchanged
takes their sha256 from the per-user cache instead (jobs/plan/digest_cache.py). A
job joining the run stats them: unchanged size and mtime reuse the planned sha256, so a resume of a
40 GB checkpoint reads nothing; a moved one is hashed again. Weights replaced in place (a file
rewritten, added or removed) would mix two models' images in one output_dir: the join is refused,
naming the files. Plans made before weights were digested carry no record, and join unchecked.
The same weights at another model.path (a copy on each node's local disk) are the run's weights: a
job that names them joins, their files hashed (or taken from the digest cache) only where their names
and sizes are the planned ones, and the run keeps naming the path it was planned with
(`run_model_path`).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

from jobs.config import GenerateConfig
from jobs.errors import UserError
from jobs.models.checkpoint import weight_files
from jobs.plan.digest_cache import DigestCache, cache_file
from jobs.plan.digests import combined_digest, digest_if_changed, file_digest, file_record

log = logging.getLogger("jobs.plan")

SHOWN = 5


def weights_record(cfg: GenerateConfig) -> dict:
    """plan.json's `weights` for a run of `model.path` (every file hashed); {} without a model.path."""
    if cfg.model.path is None:
        return {}
    root = Path(cfg.model.path)
    names = weight_files(str(root))
    digests = _hash_all(root, names)
    files = [file_record(root / name, digest=d, name=name) for name, d in zip(names, digests)]
    return {"path": cfg.model.path, "digest": combined_digest((f["path"], f["digest"]) for f in files), "files": files}


def _hash_all(root: Path, names: List[str]) -> List[str]:
    """The sha256 of each file, from the per-user digest cache where its stat stamp is unchanged."""
    t0 = time.perf_counter()
    cache = DigestCache(cache_file())
    # hashlib and file reads release the GIL: a folder's shards hash side by side
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(lambda name: cache.digest(root / name, file_digest), names))
    cache.save()
    log.info("weights under model.path=%s: %d files, %d from the digest cache (%s), %d hashed, %.1f s", root,
             len(names), cache.hits, cache.file or "off", cache.misses, time.perf_counter() - t0)
    return digests


def weights_now(cfg: GenerateConfig, planned: dict) -> Optional[str]:
    """The weights' digest for a job joining the run whose plan recorded `planned`: the planned one
    when nothing changed (stat only). Weights changed in place are refused (UserError naming the
    files and the fix) unless job.overwrite=true, which then gets the new digest: the identity
    differs and the run starts over. At another model.path: the planned digest where the files there
    are the run's weights (`same_weights_elsewhere`). None when there is nothing to compare: no
    model.path, a plan made before weight digests, or another model at another model.path (the
    identity names that difference)."""
    if cfg.model.path is None or not planned:
        return None
    if planned.get("path") != cfg.model.path:
        return same_weights_elsewhere(cfg.model.path, planned)
    root = Path(cfg.model.path)
    recorded = {f["path"]: f for f in planned["files"]}
    names = weight_files(str(root))
    digests = {n: digest_if_changed(root / n, recorded.get(n), "weight file") for n in names}
    changes = _changes(recorded, digests)
    if changes and not cfg.job.overwrite:
        raise UserError(_refusal(cfg.model.path, changes))
    return combined_digest((n, digests[n]) for n in names)


def same_weights_elsewhere(path: str, planned: dict) -> Optional[str]:
    """The planned digest where `path` holds the run's weights (every file the load can read, by name and
    sha256), copied elsewhere; None where it holds another model. Names and sizes are compared first, so
    another model is told apart without reading a byte of it."""
    root = Path(path)
    recorded = {f["path"]: f for f in planned["files"]}
    names = weight_files(str(root))
    if set(names) != set(recorded) or any((root / n).stat().st_size != recorded[n]["bytes"] for n in names):
        return None
    digest = combined_digest(zip(names, _hash_all(root, names)))
    if digest != planned["digest"]:
        return None
    log.info("model.path=%s holds the weights the run was planned with at model.path=%s (every file's sha256): "
             "joining it", path, planned["path"])
    return digest


def run_model_path(cfg: GenerateConfig, planned: dict, weights: Optional[str]) -> Optional[str]:
    """The model.path the run's identity names for this job: the planned one where this job's model.path
    holds the run's weights elsewhere (weights_now gave their digest), else its own."""
    if weights is not None and planned and planned.get("path") != cfg.model.path:
        return planned["path"]
    return cfg.model.path


def _changes(recorded: dict, digests: dict) -> List[str]:
    out = [f"{n} changed (sha256 {recorded[n]['digest'][:12]}... -> {d[:12]}...)"
           for n, d in digests.items() if n in recorded and recorded[n]["digest"] != d]
    out += [f"{n} is new" for n in digests if n not in recorded]
    out += [f"{n} is gone" for n in recorded if n not in digests]
    return out


def _refusal(path: str, changes: List[str]) -> str:
    shown = "; ".join(changes[:SHOWN]) + (f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else "")
    return (f"model.path={path!r}: the weights changed since this output_dir's run was planned: {shown}. Its "
            f"images were made with the weights it was planned with, and one run never mixes two models. Restore "
            f"those weights to resume; or give these weights a new output_dir, or job.overwrite=true to delete the "
            f"run's shards and start over with them")
