"""Resume: what an output_dir already holds, and whether this run may add to it.

`run.json` records the identity of the run that owns the folder: the dataset's digest and every
config value that changes an item's bytes. A rerun with the same identity continues (committed
keys are skipped; temp files of torn shards are removed by the sink's scan); a different one is
refused, naming what differs, unless job.overwrite=true.

Many processes may share output_dir (torchrun ranks, Slurm array tasks, started at any time):
each removes only its own torn temps (another's may be a live shard), claims run.json under a
lock, and holds a lock on its shard names while it writes (`_locks/`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, List, Optional

from jobs.config import GenerateConfig
from jobs.cpu_threads import cpu_identity
from jobs.models import demo_weights
from jobs.models.lora import lora_identity
from jobs.dataset import Record
from jobs.errors import UserError

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
OWNED = ("index.wids.json", "summary.json", "errors.jsonl", RUN_FILE)


def dataset_digest(records: Iterable[Record]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps([r.key, r.prompt, r.negative_prompt, r.seed, r.width, r.height, r.steps,
                             r.guidance_scale, r.num_frames, r.fps]).encode())
        h.update(b"\n")
    return h.hexdigest()


def run_identity(cfg: GenerateConfig, digest: str, n_records: int) -> dict:
    from jobs.models.registry import get_family

    m = cfg.model
    sampling, sink = asdict(cfg.sampling), {"format": cfg.sink.format, "quality": cfg.sink.quality}
    if get_family(m.family).video:
        sink.update(video_crf=cfg.sink.video_crf, video_preset=cfg.sink.video_preset,
                    video_frames=cfg.sink.video_frames)
    else:
        # An image family makes one frame and writes no video: these change none of its bytes, and
        # leaving them out keeps the identity of runs made before videos existed (they still resume).
        del sampling["num_frames"], sampling["fps"]
    return {
        "dataset": {"digest": digest, "records": n_records},
        "model": {"name": m.name, "family": m.family, "path": m.path, "dtype": m.dtype, "tiny": m.tiny,
                  "max_sequence_length": m.max_sequence_length,
                  "complex_human_instruction": m.complex_human_instruction, **lora_identity(m.loras),
                  **demo_weights.identity(m.tiny, m.path)},
        "text_buckets": cfg.text_buckets,
        "sampling": sampling,
        "sink": sink,
        "bcg_fusions": cfg.bcg.fusions,  # the quality tier: fast changes pixels, lossless must not
        "bcg_compile": cfg.bcg.compile,  # compiled kernels change pixels; graph replay alone does not
        **cpu_identity(cfg.device),
        # The batch an item is denoised in changes its bytes (kernels pick other reductions per batch
        # size: 5 of 40 JPEGs differed between batch 1 and 8), so the batching is part of the identity.
        # Grown sizes are measured once per output_dir and published in _plan/batching.json, so every
        # worker and resume cuts the same batches (jobs/batch_sizer.py).
        "batching": {"batch_sizes": list(cfg.bcg.batch_sizes), "pad_short_batches": cfg.bcg.pad_short_batches,
                     "batch_grow": cfg.bcg.batch_grow, "batch_grow_max": cfg.bcg.batch_grow_max},
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
    """Claim output_dir for this run, or refuse with what differs from the run that owns it.

    Array tasks start at once and all claim: the claim lock serializes them, and run.json is
    published with a hard link (fails if the name exists), so even without working locks
    exactly one identity wins and a different one is refused.
    """
    with dir_lock(output_dir, "claim"):
        for _ in range(2):
            if _claim_locked(output_dir, identity, overwrite, shard_glob):
                return
        raise AssertionError("run.json appeared and vanished twice while claiming")  # a racing wipe


def _claim_locked(output_dir: Path, identity: dict, overwrite: bool, shard_glob: str) -> bool:
    run_file = output_dir / RUN_FILE
    shards = sorted(output_dir.glob(shard_glob))
    if run_file.exists():
        old = json.loads(run_file.read_text())
        diff = _differences(old, identity)
        if not diff:
            return True
        if not overwrite:
            raise UserError(
                f"output_dir={str(output_dir)!r} holds a run with a different dataset or config:\n  "
                + "\n  ".join(diff[:20])
                + "\nUse another output_dir, or job.overwrite=true to delete its shards and start over.")
        wipe(output_dir, shard_glob)
    elif shards and not overwrite:
        raise UserError(f"output_dir={str(output_dir)!r} holds {len(shards)} shard(s) but no {RUN_FILE}: they were "
                         f"not written by this tool's run. Use another output_dir, or job.overwrite=true to delete them.")
    elif shards:
        wipe(output_dir, shard_glob)
    return publish_once(run_file, (json.dumps(identity, indent=2, sort_keys=True, default=str) + "\n").encode())


def publish_once(path: Path, data: bytes) -> bool:
    """Write `path` only if no one has: False when another claimer published it first."""
    from sinks.atomic import fsync_dir, write_synced

    from sinks.tar_shard import link_no_replace

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: racing claimers never share it
    try:
        write_synced(tmp, data)
        # A hard link fails if another claimer published first: no overwrite race. Where hard links
        # are not supported, this falls back to check + rename as shard commits do; the claim lock
        # (dir_lock) still serializes claimers there.
        link_no_replace(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def wipe(output_dir: Path, shard_glob: str) -> None:
    # A live lease means a worker is writing into this run right now: deleting under it would
    # leave a half-deleted folder that the worker keeps filling. Refuse before touching anything.
    from jobs.plan.units import PLAN_DIR
    from jobs.worker.lease import live_leases

    live = live_leases(output_dir / PLAN_DIR)
    if live:
        raise UserError(f"job.overwrite=true refused: {len(live)} worker lease(s) in output_dir={str(output_dir)!r} "
                         f"are live ({'; '.join(l.describe() for l in live[:3])}). Nothing was deleted. Stop those "
                         f"workers (or wait for their leases to expire), then rerun with job.overwrite=true")
    from sinks.sidecars import sidecar_globs

    removed = 0
    for glob in (*sidecar_globs(shard_glob), shard_glob):  # a shard's parquet and stats before the shard
        for p in list(output_dir.glob(glob)) + list(output_dir.glob("." + glob + "*")):
            p.unlink()
            removed += glob == shard_glob
    for name in OWNED:
        (output_dir / name).unlink(missing_ok=True)
    from jobs.distributed import SUMMARY_DIR
    from sinks.manifest import MANIFEST_DIR
    from sinks.quarantine import QUARANTINE_DIR

    from jobs.job_progress import PROGRESS_DIR

    for name in (MANIFEST_DIR, SUMMARY_DIR, QUARANTINE_DIR, PLAN_DIR, PROGRESS_DIR):
        if (output_dir / name).is_dir():
            shutil.rmtree(output_dir / name)
    log.warning("job.overwrite=true: removed %d shard file(s), the plan and the old run's index/summary in %s",
                removed, output_dir)


LOCK_DIR = "_locks"


def _lock_file(output_dir: Path, name: str) -> int:
    (output_dir / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    return os.open(output_dir / LOCK_DIR / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)


def _flock(fd: int, flags: int) -> bool:
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        return False
    except OSError as e:  # ENOLCK / EOPNOTSUPP: the filesystem has no flock
        log.warning("file locks are not supported here (%s); concurrent writers are not detected", e.strerror)
    return True


@contextlib.contextmanager
def dir_lock(output_dir: Path, name: str):
    """Exclusive section among every process of every run on output_dir (claim, finish)."""
    fd = _lock_file(output_dir, name)
    try:
        _flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


KILL_AT_ENV = "BCGEN_TEST_KILL_AT"
KILL_SIGNAL_ENV = "BCGEN_TEST_KILL_SIGNAL"


def kill_hook(point: str, count: int = 0, output_dir: Optional[Path] = None) -> None:
    """TEST HOOK, not a feature: BCGEN_TEST_KILL_AT=plan | batch:N | shard-write:N | upload:N makes
    the job signal itself (BCGEN_TEST_KILL_SIGNAL, default KILL) during planning, after the first
    item of batch N is handed to the sink, while a shard is open after N shards were committed, or
    (an object-store output_dir) once shard N's tar and sidecars are uploaded but not its manifest,
    so the kill tests hit those instants deterministically. Unset, it costs one environment lookup."""
    spec = os.environ.get(KILL_AT_ENV)
    if not spec or spec.partition(":")[0] != point:
        return
    n = int(spec.partition(":")[2] or 0)
    if point in ("batch", "upload") and count != n:
        return
    if point == "shard-write" and (count < n or not any(output_dir.glob(".shard-*.tar.tmp"))):
        return
    sig = signal.Signals[f"SIG{os.environ.get(KILL_SIGNAL_ENV, 'KILL')}"]
    log.warning("test hook %s=%s: sending %s to this process", KILL_AT_ENV, spec, sig.name)
    os.kill(os.getpid(), sig)


def check_writable(output_dir: Path) -> None:
    for parent in [output_dir, *output_dir.parents]:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"output_dir={str(output_dir)!r} cannot be a directory: {str(parent)!r} is a file; "
                            f"choose another output_dir (or move the file)")
        if parent.exists():
            break
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output_dir={str(output_dir)!r} is not writable ({e.strerror}); "
                        f"choose a directory you can write to") from None
