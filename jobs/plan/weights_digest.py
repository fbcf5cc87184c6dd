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
    t0 = time.perf_counter()
    cache = DigestCache(cache_file())
    # hashlib and file reads release the GIL: a folder's shards hash side by side
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(lambda name: cache.digest(root / name, file_digest), names))
    cache.save()
    log.info("weights under model.path=%s: %d files, %d from the digest cache (%s), %d hashed, %.1f s", root,
             len(names), cache.hits, cache.file or "off", cache.misses, time.perf_counter() - t0)
    files = [file_record(root / name, digest=d, name=name) for name, d in zip(names, digests)]
    return {"path": cfg.model.path, "digest": combined_digest((f["path"], f["digest"]) for f in files), "files": files}


def weights_now(cfg: GenerateConfig, planned: dict) -> Optional[str]:
    """The weights' digest for a job joining the run whose plan recorded `planned`: the planned one
    when nothing changed (stat only). Weights changed in place are refused (UserError naming the
    files and the fix) unless job.overwrite=true, which then gets the new digest: the identity
    differs and the run starts over. None when there is nothing to compare: no model.path, a plan
    made before weight digests, or another model.path (the identity names that difference)."""
    if cfg.model.path is None or not planned or planned.get("path") != cfg.model.path:
        return None
    root = Path(cfg.model.path)
    recorded = {f["path"]: f for f in planned["files"]}
    names = weight_files(str(root))
    digests = {n: digest_if_changed(root / n, recorded.get(n), "weight file") for n in names}
    changes = _changes(recorded, digests)
    if changes and not cfg.job.overwrite:
        raise UserError(_refusal(cfg.model.path, changes))
    return combined_digest((n, digests[n]) for n in names)


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
