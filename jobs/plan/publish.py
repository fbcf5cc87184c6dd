"""Join or make the plan of an output_dir: the one place where a job meets the run already there.

    lock `plan` ─▶ _plan/plan.json there?  ─ yes ─▶ same identity? ─ yes ─▶ join it
                        │ no                            │ no: refuse, naming what differs
                        ▼                               │     (job.overwrite: wipe, unless a lease is live)
                  plan into _plan.tmp-PID ─▶ claim run.json ─▶ rename to _plan/ ─▶ errors.jsonl

The lock makes concurrent jobs plan once (the others wait, then join); the claim (run.json,
published with a hard link) and the directory rename keep it exclusive even where flock is a
no-op. A job's identity needs the dataset's digest; a worker takes it from plan.json when the
file's size and mtime are unchanged, so joining a 10M-prompt plan does not read the dataset.

The identity's device part (a CPU run's thread count, jobs/plan/identity.py) is the renderer's. A
worker passes its `Renderer`. `python -m jobs.plan` renders nothing and passes none: it joins or
extends a run with the run's renderer (and batches as its own config says on that renderer's device,
so another pool is refused at plan time), and claims a new run with the device part pending. The first worker
to join a pending run settles it, under the plan lock: plan.json's identity first (a run.json lost
later is restored from it), then run.json's (the old id kept in its lineage, as job.extend keeps it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, List, Optional

from jobs.config import GenerateConfig
from jobs.dataset import rewrite_error_ledger
from jobs.errors import UserError
from jobs.kill_hook import kill_hook
from jobs.output.claim import (
    PROVENANCE_KEY,
    dir_lock,
    identity_differences,
    open_run,
    refuse_while_held,
    rewrite_run,
    wipe,
)
from jobs.output.layout import ERRORS_FILE, PLAN_DIR, PLAN_FILE, RUN_FILE, SHARD_GLOB, unit_name
from jobs.output.leases import HOST, pid_alive
from jobs.output.mirror import LocalShards, Mirror
from jobs.plan.build import dataset_digest, dataset_files, plan_dataset, source_digest
from jobs.plan.digests import digest_if_changed
from jobs.plan.extend import check_files_appended, extend_plan, only_dataset_changed
from jobs.plan.identity import (
    DEVICE_KEYS,
    DEVICE_PENDING,
    RENDERER_KEYS,
    Renderer,
    batching_identity,
    device_part,
    plan_identity,
    renders_on,
)
from jobs.plan.units import DamagedPlan, PlanManifest, check_unit_file, read_manifest, unit_digest, write_manifest
from jobs.plan.weights_digest import run_model_path, weights_now, weights_record
from jobs.provenance import provenance

log = logging.getLogger("jobs.plan")


def _digest_now(cfg: GenerateConfig, existing: PlanManifest) -> str:
    """The dataset's digest now: each file's planned sha256 while its size and mtime are unchanged,
    else the file is read again (a folder that gained a file hashes that file only); a Hugging Face
    dataset's fingerprint, read again (no pass over its rows)."""
    files = dataset_files(cfg)
    d = existing.dataset
    planned = {r["path"]: r for r in d.get("files") or [d]}  # one file: the dataset record is its record
    digests = [source_digest(cfg, f) if f.fmt == "hf" else
               digest_if_changed(f.path, planned.get(str(f.path)), "dataset file") for f in files]
    return dataset_digest(files, digests)


def join_or_make_plan(cfg: GenerateConfig, shards: LocalShards, divisor: int,
                      renderer: Optional[Renderer] = None,
                      on_joined: Optional[Callable[[], None]] = None) -> PlanManifest:
    """The plan of output_dir (open_plan); with an object store, fetched from it first and published
    to it after (jobs/output/mirror.py), under one lock of the staging folder. `renderer`: the
    worker's device; None for a job that renders nothing (`python -m jobs.plan`). `on_joined`: called
    once the plan is this job's, before the plan lock is let go (a worker takes its hold on the run
    there: jobs/worker/presence.py)."""
    if not isinstance(shards, Mirror):
        return open_plan(cfg, shards.output_dir, divisor, renderer=renderer, on_joined=on_joined)
    with dir_lock(shards.output_dir, "mirror"):
        before = shards.hydrate(cfg.job.overwrite)
        manifest = open_plan(cfg, shards.output_dir, divisor, shards.orphaned_shards, shards.remote_url, renderer,
                             on_joined)
        shards.publish_plan(before)
    return manifest


def open_plan(cfg: GenerateConfig, output_dir: Path, divisor: int, shards_elsewhere: int = 0,
              shown: Optional[str] = None, renderer: Optional[Renderer] = None,
              on_joined: Optional[Callable[[], None]] = None) -> PlanManifest:
    """The plan this job works on (joined or made); raises UserError when the job must be refused.
    `shards_elsewhere`, `shown`: an object store's shards and URL, as for open_run; `renderer`,
    `on_joined`: as for join_or_make_plan."""
    with dir_lock(output_dir, "plan"):
        manifest = _open_locked(cfg, output_dir, divisor, shards_elsewhere, shown, renderer)
        if on_joined is not None:  # under the lock: a job.overwrite after this sees the hold it takes
            on_joined()
        return manifest


def _open_locked(cfg: GenerateConfig, output_dir: Path, divisor: int, shards_elsewhere: int,
                 shown: Optional[str], renderer: Optional[Renderer]) -> PlanManifest:
    plan_dir = output_dir / PLAN_DIR
    claimed = _identity_in(output_dir / RUN_FILE)  # None: no run.json, or a damaged one
    if (plan_dir / PLAN_FILE).exists():
        try:
            existing = read_manifest(plan_dir)
            if cfg.job.verify == "full":
                for unit in existing.units:
                    check_unit_file(plan_dir, existing, unit.id)
        except DamagedPlan as err:
            if cfg.job.verify != "full":
                raise
            return _repair(cfg, output_dir, plan_dir, divisor, err, renderer, claimed)
        run = claimed or existing.identity
        weights = weights_now(cfg, existing.weights)  # weights changed in place: refused here, naming them
        # the same weights at another model.path (a node's local copy) are the run's: it keeps its path
        path = run_model_path(cfg, existing.weights, weights)
        ident = _job_identity(cfg, _digest_now(cfg, existing), existing.dataset["records"], weights, renderer, run,
                              path)
        settles = renderer is not None and _pending(existing.identity, claimed)
        differences = _run_differences(claimed, ident, settles)
        if settles and not differences and _same_but_device(existing.identity, ident):
            assert renderer is not None  # for mypy: `settles` says so
            _settle_device(cfg, output_dir, plan_dir, existing, ident, renderer, claimed)
        elif cfg.job.extend and only_dataset_changed(differences):
            return _extend(cfg, output_dir, plan_dir, existing, divisor, weights, renderer, run, path)
        open_run(output_dir, ident, cfg.job.overwrite, provenance=_provenance(cfg, renderer),
                 shards_elsewhere=shards_elsewhere, shown=shown)  # same: joins; else refuses or wipes
        if (plan_dir / PLAN_FILE).exists():
            log.info("joining the plan in %s: %d items in %d units", plan_dir, existing.n_items,
                     len(existing.units))
            return existing
    elif (output_dir / RUN_FILE).exists() and any(output_dir.glob(SHARD_GLOB)):
        if not cfg.job.overwrite:
            if cfg.job.verify == "full" and claimed is not None:
                # Restored as a damaged plan is: planned again, kept only if the new plan is the run's.
                plan_dir.mkdir(parents=True, exist_ok=True)
                return _repair(cfg, output_dir, plan_dir, divisor, DamagedPlan(f"{plan_dir / PLAN_FILE} is missing"),
                               renderer, claimed)
            raise UserError(f"output_dir={str(output_dir)!r} holds shards of a run whose plan ({plan_dir / PLAN_FILE}) "
                             f"is missing (deleted by hand, or never written by an older bcgen): its items cannot be "
                             f"matched to units. The plan is deterministic, so rerun the same command with "
                             f"job.verify=full: it plans again and restores the plan when the new one is this run's "
                             f"({RUN_FILE}; nothing committed is touched). Or use another output_dir, or "
                             f"job.overwrite=true to delete the shards and start over.")
        wipe(output_dir, SHARD_GLOB)
        claimed = None  # wiped: the new run's device part is this job's
    return _make(cfg, output_dir, plan_dir, divisor, renderer, claimed)


def _job_identity(cfg: GenerateConfig, digest: str, records: int, weights: Optional[str],
                  renderer: Optional[Renderer], run: Optional[dict], model_path: Optional[str] = None) -> dict:
    """This job's plan identity. A renderer's device part is its own. A job that renders nothing
    takes the device part of `run` (the identity there), where it joins or extends that run; for a
    new run, or one it would replace, its own (pending, or none for device=cuda). `model_path`: as
    for identity.run_identity."""
    ident = plan_identity(cfg, digest, records, weights, None if renderer is None else renderer.identity(),
                          model_path)
    if renderer is not None or run is None:
        return ident
    rest = [d for d in identity_differences(run, ident) if not _of_device(d)]
    if rest and not only_dataset_changed(rest):
        return ident  # another run: refused, or replaced (job.overwrite) with this job's device part
    return {**{k: v for k, v in ident.items() if k not in DEVICE_KEYS}, **_on_the_run_renderer(cfg, run)}


def _on_the_run_renderer(cfg: GenerateConfig, run: dict) -> dict:
    """The device part a job that renders nothing joins `run` with. Pending: the run's as it is (its
    first worker settles it). Settled: the run's renderer (its device, its thread count), and how this
    job's bcg config batches on that device, which is known now: so a `jobs.plan` with another pool or
    another bcg.invariant than the run's is refused here, naming the field, and not later, when the
    workers it planned for join."""
    part = device_part(run)
    device_type = renders_on(part)
    if device_type is None:
        return part
    renderer = {k: v for k, v in part.items() if k in RENDERER_KEYS}
    return {**renderer, **batching_identity(cfg.bcg, device_type)}


def _identity_in(path: Path, key: Optional[str] = None) -> Optional[dict]:
    """The identity a run file holds (run.json; plan.json's under `key`), or None where it is missing
    or damaged."""
    try:
        doc = json.loads(path.read_bytes())
        ident = doc[key] if key else doc
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ident if isinstance(ident, dict) else None


def _pending(planned: dict, claimed: Optional[dict]) -> bool:
    """Whether the run's device part waits for its first worker: in plan.json, or in run.json (a
    worker that settled plan.json and died before run.json). An older bcgen's pending part also held
    the batching part, which the first worker settles with it."""
    return any(device_part(i).get("device") == DEVICE_PENDING["device"] for i in (planned, claimed) if i is not None)


def _run_differences(claimed: Optional[dict], ident: dict, settles: bool) -> List[str]:
    """What differs between run.json (`claimed`) and this job's identity: nothing where run.json is
    missing or damaged (open_run restores it from plan.json), and nothing of the device part where
    this job settles it (below in open_plan, or in _extend)."""
    if claimed is None:
        return []
    return [d for d in identity_differences(claimed, ident) if not (settles and _of_device(d))]


def _same_but_device(planned: dict, ident: dict) -> bool:
    return all(_of_device(d) for d in identity_differences(planned, ident))


def _of_device(difference: str) -> bool:
    """Whether a `key: old -> new` line (claim.identity_differences) is about the device part."""
    return difference.partition(":")[0] in DEVICE_KEYS


def _settle_device(cfg: GenerateConfig, output_dir: Path, plan_dir: Path, plan: PlanManifest, ident: dict,
                   renderer: Renderer, claimed: Optional[dict]) -> None:
    """This worker is the first of a run claimed with its device part pending: record its own."""
    plan.lineage = plan.lineage_with_own_id()  # as rewrite_run keeps the pending id in run.json's
    plan.identity = ident
    write_manifest(plan_dir, plan)
    if claimed is not None:
        rewrite_run(output_dir, ident, _provenance(cfg, renderer), event="device_settled")
    # else run.json is missing or damaged: open_run restores it from plan.json, which is now this job's
    threads = ident.get("cpu_threads")
    log.info("the run's device part, settled by its first worker: %s%s", renderer.device,
             f" with {threads} CPU threads" if threads else "")


def _repair(cfg: GenerateConfig, output_dir: Path, plan_dir: Path, divisor: int, why: DamagedPlan,
            renderer: Optional[Renderer], claimed: Optional[dict]) -> PlanManifest:
    """Plan again and put back the plan's files, if the new plan is the run's (run.json says so)."""
    log.warning("%s: planning again to restore it", why.args[0].split(";")[0])
    work = output_dir / f"{PLAN_DIR}.tmp-{HOST}-{os.getpid()}"
    try:
        manifest = _plan_into(cfg, work, divisor, renderer, claimed)
        try:
            claimed = json.loads((output_dir / RUN_FILE).read_bytes())
            claimed.pop(PROVENANCE_KEY, None)  # when, on which host: never part of the comparison
        except (OSError, ValueError, AttributeError):
            claimed = None
        if claimed != json.loads(json.dumps(manifest.identity, default=str)):
            raise UserError(f"{why.args[0].split(';')[0]}, and this job's dataset or config is not the run's "
                            f"({RUN_FILE}), so its plan cannot be restored from them. Nothing was deleted. Rerun "
                            f"with the run's own dataset and config, or use another output_dir")
        for path in sorted(work.glob("unit-*.parquet")) + [work / PLAN_FILE]:
            os.replace(path, plan_dir / path.name)
        log.warning("restored %s from a new plan of the same dataset and config (%d units)", plan_dir,
                    len(manifest.units))
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _plan_into(cfg: GenerateConfig, work: Path, divisor: int, renderer: Optional[Renderer],
               run: Optional[dict]) -> PlanManifest:
    result = plan_dataset(cfg, divisor, work)
    _seal(cfg, result.manifest, work, renderer, run)
    return result.manifest


def _seal(cfg: GenerateConfig, manifest: PlanManifest, work: Path, renderer: Optional[Renderer],
          run: Optional[dict]) -> None:
    """The plan's identity (dataset, config, weights, device part: _job_identity) and its files'
    digests, then plan.json."""
    manifest.weights = weights_record(cfg)
    manifest.identity = _job_identity(cfg, manifest.dataset["digest"], manifest.dataset["records"],
                                      manifest.weights.get("digest"), renderer, run)
    manifest.unit_digests = {str(u.id): unit_digest(work / f"{unit_name(u.id)}.parquet") for u in manifest.units}
    write_manifest(work, manifest)


def _make(cfg: GenerateConfig, output_dir: Path, plan_dir: Path, divisor: int, renderer: Optional[Renderer],
          claimed: Optional[dict]) -> PlanManifest:
    """`claimed`: run.json's identity, where a run was claimed but its plan never published."""
    _remove_stale_work(output_dir)
    work = output_dir / f"{PLAN_DIR}.tmp-{HOST}-{os.getpid()}"
    try:
        result = plan_dataset(cfg, divisor, work)
        kill_hook("plan")
        manifest = result.manifest
        _seal(cfg, manifest, work, renderer, claimed)
        open_run(output_dir, manifest.identity, cfg.job.overwrite, provenance=_provenance(cfg, renderer))
        rewrite_error_ledger(output_dir / ERRORS_FILE, result.errors)  # a NaN image's entry outlives a re-plan
        try:
            os.rename(work, plan_dir)
        except OSError:  # an identical job published first (its claim matched ours): use its plan
            if not (plan_dir / PLAN_FILE).exists():
                raise
            manifest = read_manifest(plan_dir)
        log.info("plan written to %s: %d items in %d units", plan_dir, manifest.n_items, len(manifest.units))
        for line in summary_lines(manifest):
            log.info(line)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _provenance(cfg: GenerateConfig, renderer: Optional[Renderer]) -> dict:
    """run.json's provenance: when the run was claimed, and the software and device of that job
    (none for a job that renders nothing)."""
    return provenance(cfg.bcg.fusions, cfg.bcg.compile, None if renderer is None else renderer.device)


def _extend(cfg: GenerateConfig, output_dir: Path, plan_dir: Path, existing: PlanManifest, divisor: int,
            weights: Optional[str], renderer: Optional[Renderer], run: dict,
            model_path: Optional[str]) -> PlanManifest:
    """job.extend=true with a grown dataset: plan it, add its new rows as new units (jobs/plan/extend.py).
    `weights`: their digest as the join checked it (unchanged, or extend would not be asked); `run`:
    the run's identity (a job that renders nothing keeps its device part; a pending run's first
    worker settles it here); `model_path`: the path the run names its weights by (run_model_path)."""
    # Every live worker, not only those holding a unit's lease: one loading its model holds none yet, and
    # would find its plan replaced under it.
    refuse_while_held(output_dir, "job.extend=true", "Nothing was changed: they work on the plan extend would change")
    _remove_stale_work(output_dir)
    work = output_dir / f"{PLAN_DIR}.tmp-{HOST}-{os.getpid()}"
    try:
        result = plan_dataset(cfg, divisor, work)
        new = result.manifest
        new.identity = _job_identity(cfg, new.dataset["digest"], new.dataset["records"], weights, renderer, run,
                                     model_path)
        check_files_appended(existing, new)
        manifest, added = extend_plan(existing, plan_dir, new, work)
        rewrite_run(output_dir, manifest.identity, _provenance(cfg, renderer))
        rewrite_error_ledger(output_dir / ERRORS_FILE, result.errors)  # a NaN image's entry outlives a re-plan
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("job.extend: %d new item(s) in %d new unit(s) added to the %d of the run in %s (its done units are kept)",
             added, len(manifest.units) - len(existing.units), existing.n_items, output_dir)
    return manifest


def _remove_stale_work(output_dir: Path) -> None:
    """Work folders of planners killed mid-plan (their spill can be gigabytes). Only a dead
    planner's: on a filesystem without flock another planner may be working right now."""
    for work in output_dir.glob(f"{PLAN_DIR}.tmp-*"):
        host, _, pid = work.name[len(PLAN_DIR) + 5:].rpartition("-")
        if host == HOST and pid.isdigit() and not pid_alive(int(pid)):
            log.info("removing %s, left by a planner that was killed", work)
            shutil.rmtree(work, ignore_errors=True)


def summary_lines(manifest: PlanManifest, limit: int = 12) -> list:
    ranked = sorted(manifest.signatures.items(), key=lambda kv: -kv[1])
    lines = [f"plan: {manifest.n_items} items, {len(manifest.units)} units, {len(ranked)} signatures"
             + (f", {manifest.truncated} prompts truncated" if manifest.truncated else "")]
    for sig, n in ranked[:limit]:
        units = sum(1 for u in manifest.units if str(u.signature) == sig)
        lines.append(f"  {sig:40s} {n:9d} items  {units} unit(s)")
    if len(ranked) > limit:
        lines.append(f"  ... and {len(ranked) - limit} more signatures")
    return lines

