"""The claim on an output_dir: whether this run may add to it, its locks, and the wipe of a run.

`run.json` records the identity of the run that owns the folder (jobs/plan/identity.py): the
dataset's digest and every config value that changes an item's bytes. A rerun with the same
identity continues (committed keys are skipped; temp files of torn shards are removed by the
sink's scan); a different one is refused, naming what differs, unless job.overwrite=true.

Many processes may share output_dir (torchrun ranks, Slurm array tasks, started at any time):
each removes only its own torn temps (another's may be a live shard), claims run.json under a
lock, and holds a lock on its shard names while it writes (`_locks/`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import List, Optional

from filelock import FileLock

from jobs.errors import UserError
from jobs.output.layout import LOCK_DIR, LOG_DIR, PLAN_DIR, PLAN_FILE, RUN_DIRS, RUN_FILE, RUN_FILES, SHARD_GLOB
from jobs.output.leases import live_holders, live_leases
from sinks.atomic import atomic_write_bytes, fsync_dir, write_synced
from sinks.sidecars import sidecar_globs
from sinks.tar_shard import link_no_replace

log = logging.getLogger(__name__)


def _differences(old: dict, new: dict, prefix: str = "") -> List[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {_short(a)} -> {_short(b)}")
    return out


def _batching_hint(old: dict, new: dict) -> str:
    """The `bcg.*` overrides that resume `old`'s run when how it batched is all that differs: the pool
    and the batch-invariant mode are defaults a user rarely sets, so a rerun after a default changed
    (the image presets' [1, 2, 4, 8] became [8]; bcg.invariant=null turned the mode on with CUDA)
    would otherwise be refused with no way back but the old values."""
    keys = ("batching", "invariant")
    if {k: v for k, v in old.items() if k not in keys} != {k: v for k, v in new.items() if k not in keys}:
        return ""
    a, b = old.get("batching"), new.get("batching")
    if old.get("invariant") and not new.get("invariant"):
        return "\nTo resume that run, pass its batch-invariant mode back: bcg.invariant=true"
    if not isinstance(a, dict) or a == b:
        return ""
    # new's pool is not in its identity where the mode is on: pass every one of old's settings back
    pool = sorted(a.items()) if not isinstance(b, dict) else [(k, v) for k, v in sorted(a.items()) if b.get(k) != v]
    args = " ".join(f"bcg.{k}={_override_value(v)}" for k, v in pool)
    mode = "bcg.invariant=false " if new.get("invariant") else ""
    return f"\nTo resume that run, pass its batching back: {mode}{args}"


def _override_value(v) -> str:
    """A value as a command-line override spells it: [1,2,4,8] (no spaces), true, off."""
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def _short(v) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 80 else s[:77] + "..."


PROVENANCE_KEY = "provenance"  # run.json's volatile part (jobs/provenance.py): never compared


def open_run(output_dir: Path, identity: dict, overwrite: bool, shard_glob: str = SHARD_GLOB,
             provenance: Optional[dict] = None, shards_elsewhere: int = 0, shown: Optional[str] = None) -> None:
    """Claim output_dir for this run, or refuse with what differs from the run that owns it.

    `provenance` (when, which versions, which GPU) is written beside the identity under its own
    key when this job publishes run.json, and is left out of every comparison: a resume with a
    newer torch, on another host or another day, is the same run.

    Array tasks start at once and all claim: the claim lock serializes them, and run.json is
    published with a hard link (fails if the name exists), so even without working locks
    exactly one identity wins and a different one is refused.

    `shards_elsewhere`: shards of this output_dir that are not in `output_dir` itself (an object
    store's, while `output_dir` is its staging folder): they count as the folder's own; `shown`
    is then the output_dir the user named, for the messages.
    """
    with dir_lock(output_dir, "claim"):
        for _ in range(2):
            if _claim_locked(output_dir, identity, overwrite, shard_glob, provenance, shards_elsewhere,
                             shown or str(output_dir)):
                return
        raise AssertionError("run.json appeared and vanished twice while claiming")  # a racing wipe


def _claim_locked(output_dir: Path, identity: dict, overwrite: bool, shard_glob: str,
                  provenance: Optional[dict], shards_elsewhere: int, shown: str) -> bool:
    run_file = output_dir / RUN_FILE
    shards = len(list(output_dir.glob(shard_glob))) + shards_elsewhere
    identity = {k: v for k, v in identity.items() if k != PROVENANCE_KEY}
    if (run_file.exists() and _unreadable(run_file)) or (not run_file.exists() and shards):
        if _planned_identity(output_dir) == identity:
            # run.json says what the plan says (plan.json carries the identity too): restore it from there,
            # with the lineage the plan keeps (an extended run's earlier ids: its shards committed under them)
            log.warning("%s is %s, but _plan/%s holds this job's identity: restoring it", run_file,
                        "missing" if not run_file.exists() else "unreadable", PLAN_FILE)
            lineage = _planned_lineage(output_dir)
            atomic_write_bytes(run_file, run_bytes(identity, dict(provenance or {}, **({"lineage": lineage}
                                                                                      if lineage else {}))))
            return True
        if run_file.exists():
            raise UserError(f"{shown}/{RUN_FILE} is unreadable (damaged), and _plan/{PLAN_FILE} does not hold "
                            f"this job's identity to restore it from. Nothing was deleted. If this output_dir is "
                            f"this job's, restore run.json from a backup; else use another output_dir")
    if run_file.exists():
        old = json.loads(run_file.read_text())
        before = old.pop(PROVENANCE_KEY, None)
        diff = _differences(old, identity)
        if not diff:
            return True
        if _planned_identity(output_dir) == identity:
            # run.json names another run than the plan it was claimed with, and that plan is this job's:
            # run.json was damaged and still parses (a flipped bit), or a rewrite of it was cut short.
            log.warning("%s disagrees with _plan/%s, which holds this job's identity (%s): restoring it from there",
                        run_file, PLAN_FILE, "; ".join(diff[:3]))
            kept = dict(before) if isinstance(before, dict) else dict(provenance or {})
            kept["lineage"] = sorted(set(_ids(kept.get("lineage"))) | set(_planned_lineage(output_dir)))
            _rewrite_locked(output_dir, identity, kept, identity_id(old), "restored", provenance)
            return True
        if not overwrite:
            # A run that committed nothing (a job that failed before its first shard, a bad model.path fixed
            # since): say that starting over loses nothing, rather than send the user to restore what failed.
            over = ("job.overwrite=true to start over: it holds no committed shard, so nothing is lost" if not shards
                    else "job.overwrite=true to delete its shards and start over")
            raise UserError(
                f"output_dir={shown!r} holds a run with a different dataset or config:\n  "
                + "\n  ".join(diff[:20])
                + f"\nUse another output_dir, or {over}."
                + _batching_hint(old, identity))
        wipe(output_dir, shard_glob)
    elif shards and not overwrite:
        raise UserError(f"output_dir={shown!r} holds {shards} shard(s) but no {RUN_FILE}: they were "
                         f"not written by this tool's run. Use another output_dir, "
                         f"or job.overwrite=true to delete them.")
    elif shards:
        wipe(output_dir, shard_glob)
    return publish_once(run_file, run_bytes(identity, provenance))


def run_bytes(identity: dict, provenance: Optional[dict] = None) -> bytes:
    """run.json's bytes: the identity, and provenance under its own key (never compared)."""
    doc = dict(identity, **({PROVENANCE_KEY: provenance} if provenance else {}))
    return (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode()


def _unreadable(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
        return False
    except ValueError:
        return True


def _planned_identity(output_dir: Path):
    """The identity plan.json records (the planner writes it with the plan), or None."""
    try:
        return json.loads((output_dir / PLAN_DIR / PLAN_FILE).read_bytes())["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _planned_lineage(output_dir: Path) -> List[str]:
    """The lineage plan.json keeps (jobs/plan/units.py PlanManifest.lineage), or [] where it has none."""
    try:
        return _ids(json.loads((output_dir / PLAN_DIR / PLAN_FILE).read_bytes()).get("lineage"))
    except (OSError, ValueError, AttributeError):
        return []


def _ids(lineage) -> List[str]:
    """A lineage as read from a file (a list of run ids); [] for anything else (damage)."""
    return [str(i) for i in lineage] if isinstance(lineage, list) else []


def run_id(output_dir: Path) -> str:
    """The run's id, which every manifest it commits carries (sinks/owned_scan.py adopts only its
    own run's shards): a digest of run.json's identity. Provenance is left out, as from every
    comparison: a resume on another host, or with a newer torch, is the same run."""
    return identity_id(json.loads((output_dir / RUN_FILE).read_bytes()))


def identity_id(doc: dict) -> str:
    """The run id of a run.json document (or of plan.json's identity): provenance left out."""
    doc = {k: v for k, v in doc.items() if k != PROVENANCE_KEY}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_lineage(output_dir: Path) -> frozenset:
    """The ids this run had before its current one: `job.extend` changes the identity (a larger
    dataset), and the shards committed before keep the id they were committed under."""
    try:
        doc = json.loads((output_dir / RUN_FILE).read_bytes())
    except (OSError, ValueError):
        return frozenset()
    prov = doc.get(PROVENANCE_KEY) if isinstance(doc, dict) else None
    return frozenset(_ids(prov.get("lineage") if isinstance(prov, dict) else None))


def run_differences(output_dir: Path, identity: dict) -> List[str]:
    """What differs between the run that owns output_dir and `identity` (provenance aside); [] when
    they are the same run or no run owns it."""
    run_file = output_dir / RUN_FILE
    if not run_file.exists():
        return []
    return identity_differences(json.loads(run_file.read_text()), identity)


def identity_differences(old: dict, new: dict) -> List[str]:
    """What differs between two identities (run.json's or plan.json's), provenance aside, as
    `key.path: old -> new` lines."""
    return _differences({k: v for k, v in old.items() if k != PROVENANCE_KEY},
                        {k: v for k, v in new.items() if k != PROVENANCE_KEY})


def rewrite_run(output_dir: Path, identity: dict, provenance: Optional[dict], event: str = "extended") -> None:
    """Replace run.json's identity (job.extend: the run now holds a larger dataset; the first worker
    of a run whose device part was pending: its own), keeping when it was first claimed, and when
    it changed under `event`; under the claim lock, by the job that holds the plan lock."""
    with dir_lock(output_dir, "claim"):
        old = json.loads((output_dir / RUN_FILE).read_text())
        _rewrite_locked(output_dir, identity, old.get(PROVENANCE_KEY) or {}, identity_id(old), event, provenance)


def _rewrite_locked(output_dir: Path, identity: dict, kept: dict, before: str, event: str,
                    provenance: Optional[dict]) -> None:
    """run.json anew with `identity`: the provenance it had (`kept`), when it changed under `event`, and the
    id it had (`before`) in its lineage, so the shards committed under that id stay the run's."""
    prov = dict(kept, **{event: (provenance or {}).get("time")})
    prov["lineage"] = sorted(set(_ids(prov.get("lineage"))) | {before})  # the ids its shards may carry
    atomic_write_bytes(output_dir / RUN_FILE, run_bytes(identity, prov))


def publish_once(path: Path, data: bytes) -> bool:
    """Write `path` only if no one has: False when another claimer published it first."""
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
    refuse_while_held(output_dir)
    removed = 0
    for glob in (*sidecar_globs(shard_glob), shard_glob):  # a shard's parquet and stats before the shard
        for p in list(output_dir.glob(glob)) + list(output_dir.glob("." + glob + "*")):
            p.unlink()
            removed += glob == shard_glob
    for name in RUN_FILES:
        (output_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        if (output_dir / name).is_dir():
            shutil.rmtree(output_dir / name)
    log.warning("job.overwrite=true: removed %d shard file(s), the plan and the old run's index/summary in %s",
                removed, output_dir)


def refuse_while_held(output_dir: Path, action: str = "job.overwrite=true",
                      consequence: str = "Nothing was deleted") -> None:
    """A live worker is in this run right now (generating a unit, or loading its model, sizing batches,
    waiting between units): deleting under it (`job.overwrite`) would leave a half-deleted folder that it
    keeps filling, or fails in; replacing its plan (`job.extend`) would leave it working on units the new
    plan renumbered. Refuse before touching anything. A worker that is gone (its process on this host, or
    not heard from for its ttl) holds nothing."""
    plan_dir = output_dir / PLAN_DIR
    workers, leases = live_holders(plan_dir), live_leases(plan_dir)
    if not workers and not leases:
        return
    held = {(w.host, w.pid) for w in workers}  # a worker holding a unit is named once, by its hold
    named = [w.describe() for w in workers] + [u.describe() for u in leases if (u.host, u.pid) not in held]
    raise UserError(f"{action} refused: output_dir={str(output_dir)!r} is in use by {len(named)} live "
                    f"worker(s) of its run ({'; '.join(named[:3])}{'; ...' if len(named) > 3 else ''}). "
                    f"{consequence}. Wait for them to finish, or stop them, then rerun with {action} (a "
                    f"worker killed on another host counts as live until job.lease_ttl_s passes without its "
                    f"heartbeat)")


@contextlib.contextmanager
def dir_lock(output_dir: Path, name: str):
    """Exclusive section among every process of every run on output_dir (claim, plan, finish):
    filelock's flock on `_locks/NAME.lock`. Where the filesystem has no flock, filelock falls back
    to its own soft lock; the claim (a hard-linked run.json) stays exclusive without either."""
    (output_dir / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    with FileLock(str(output_dir / LOCK_DIR / f"{name}.lock"), mode=0o644):
        yield


def check_not_inside_a_run(output_dir: Path) -> None:
    """Refuse an output_dir inside another run's bookkeeping (`OTHER/_plan/...`): that run's
    job.overwrite, or its resume, would delete or quarantine this one's files."""
    path = Path(os.path.abspath(output_dir))
    for parent in path.parents:
        rel = path.relative_to(parent).parts
        if rel and rel[0] in (*RUN_DIRS, LOCK_DIR, LOG_DIR) and (parent / RUN_FILE).exists():
            raise UserError(f"output_dir={str(output_dir)!r} is inside {parent / rel[0]}, the bookkeeping of the "
                            f"run in {parent}: that run's resume or job.overwrite would delete or move this one's "
                            f"files. Choose an output_dir outside {parent}/{rel[0]}")
    # A run inside another's folder, or around one: a reader of the outer folder (pyarrow's folder discovery,
    # a glob of its parquet) reads both runs' samples as one dataset, duplicates and all.
    outer = next((parent for parent in path.parents if (parent / RUN_FILE).is_file()), None)
    if outer is not None:
        raise UserError(f"output_dir={str(output_dir)!r} is inside the folder of the run in {outer}: a reader of "
                        f"that folder would read both runs as one. Choose a folder beside it, e.g. "
                        f"{outer.parent / (path.name + '-' + outer.name)}")
    inner = next((child for child in _subfolders(path) if (child / RUN_FILE).is_file()), None)
    if inner is not None and not (path / RUN_FILE).is_file():
        raise UserError(f"output_dir={str(output_dir)!r} holds the run in {inner}: a reader of output_dir would read "
                        f"both runs as one. Choose a folder beside that run, not around it (e.g. {inner}-2)")


def _subfolders(path: Path) -> list:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:  # not there yet, or not a folder: nothing inside
        return []


def check_writable(output_dir: Path) -> None:
    """output_dir is (or can be made) a folder this process writes, outside another run's
    bookkeeping. Nothing is created for it: the probe goes into output_dir if it exists, else into
    the nearest folder above it that does."""
    check_not_inside_a_run(output_dir)
    for parent in [output_dir, *output_dir.parents]:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"output_dir={str(output_dir)!r} cannot be a directory: {str(parent)!r} is a file; "
                            f"choose another output_dir (or move the file)")
        if parent.exists():
            break
    try:
        probe = parent / f".bcgen-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output_dir={str(output_dir)!r} is not writable ({e.strerror} in {str(parent)!r}); "
                        f"choose a directory you can write to") from None


def remove_unclaimed(output_dir: Path, log_dir: Optional[Path], existed: bool) -> None:
    """A job refused before it claimed output_dir (bad config or dataset) leaves nothing there:
    its own log folder (Hydra made it before the job started), and then `logs/`, `_locks/` and
    output_dir itself where nothing else is in them. A folder that holds a run (run.json) is left
    as it is, this job's log included, and so is anything this job did not make; output_dir too,
    when it `existed` before."""
    output_dir = output_dir.absolute()
    if not output_dir.is_dir() or (output_dir / RUN_FILE).exists():
        return  # a run owns it: its logs (this job's too) are the run's
    if log_dir is not None and output_dir in Path(log_dir).absolute().parents:
        shutil.rmtree(log_dir, ignore_errors=True)
    for name in (LOG_DIR, LOCK_DIR):
        folder = output_dir / name
        ours = name == LOCK_DIR and all(p.suffix == ".lock" for p in folder.glob("*"))
        if folder.is_dir() and (ours or not any(folder.iterdir())):
            if set(p.name for p in output_dir.iterdir()) <= {LOG_DIR, LOCK_DIR}:
                shutil.rmtree(folder, ignore_errors=True)
    if not existed and not any(output_dir.iterdir()):
        output_dir.rmdir()
