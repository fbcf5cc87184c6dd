"""Every name in an output_dir, in one place: what a run writes, where, and what belongs to it.

    output_dir/
      shard-uNNNNNNN-IIII.tar      a work unit's shards (tar, then its parquet and _stats.json beside it)
      index.wids.json              the wids index of every done unit's shards (written at the end)
      summary.json                 the job's summary, merged over its parts
      errors.jsonl                 bad rows (dataset.on_error=skip) and NaN images (job.on_nonfinite=ledger)
      run.json                     the run's identity: a rerun with another one is refused
      _plan/                       plan.json, unit-NNNNNNN.parquet, batching.json, done/, leases/, workers/
      _manifest/                   one json per committed shard (sinks/manifest.py)
      _quarantine/                 shards that no longer matched their manifest, with log.jsonl
      _summary/ _progress/ _timeline/    per-part summaries, live progress, per-batch timelines
      _locks/                      flock files (claim, plan, finish, mirror)
      logs/                        Hydra's run logs, one folder per process
      _staging/                    an object store's only: one marker per live worker process, naming
                                   its staging folder (jobs/output/staging_claim.py)

    staging folder (an object-store output_dir's local side): the layout above, plus
      staging-id.json              the folder's id, made once: every worker that mounts it shares it

Readers and writers import names from here, never spell them: a wipe, a mirror and a resume then
agree on what a run owns. Names sinks/ gives its files come from sinks/names.py.
"""

from __future__ import annotations

import hashlib

from sinks.names import INDEX_NAME, MANIFEST_DIR, QUARANTINE_DIR, QUARANTINE_LOG

# -- files at the top ------------------------------------------------------------------------
RUN_FILE = "run.json"
ERRORS_FILE = "errors.jsonl"
SUMMARY_FILE = "summary.json"
INDEX_FILE = INDEX_NAME

# -- bookkeeping folders -----------------------------------------------------------------------
PLAN_DIR = "_plan"
SUMMARY_DIR = "_summary"
PROGRESS_DIR = "_progress"
TIMELINE_DIR = "_timeline"
LOCK_DIR = "_locks"
LOG_DIR = "logs"
STAGING_MARKER_DIR = "_staging"  # on the object store only: never wiped, never mirrored
STAGING_ID_FILE = "staging-id.json"  # in the staging folder only: never uploaded

# -- inside _plan/ -------------------------------------------------------------------------------
PLAN_FILE = "plan.json"
BATCHING_FILE = "batching.json"
DONE_DIR = "done"  # _plan/done/unit-NNNNNNN.json: the unit's shards are all committed
LEASE_DIR = "leases"  # _plan/leases/unit-NNNNNNN.lease: a worker holds the unit
WORKER_DIR = "workers"  # _plan/workers/HOST-PID.lease: a worker is in the run (jobs/output/leases.py)

# What a run owns besides its shards: a wipe removes these, a mirror keeps the remote copy of each.
RUN_FILES = (RUN_FILE, ERRORS_FILE, INDEX_FILE, SUMMARY_FILE)
RUN_DIRS = (MANIFEST_DIR, PLAN_DIR, SUMMARY_DIR, QUARANTINE_DIR, TIMELINE_DIR, PROGRESS_DIR)

SHARD_GLOB = "shard-*.tar"


def run_folder_name(model: str, overrides: str) -> str:
    """The default output_dir's folder under outputs/ (Hydra's resolver `bcgen_run_folder`):
    `sana_tiny` for a plain run, `sana_tiny--sampling.steps:2` for one with overrides (each job of
    a sweep; conf/generate.yaml sets Hydra's `k:v--k:v` form). Side by side, so no run's folder lies
    inside another's: a reader of one run's folder (pyarrow's folder discovery, a glob of its shards)
    sees that run alone."""
    # A `/` in a value (or in model.name) must not open a subfolder, nor `..` climb out of outputs/.
    name = model.replace("/", "_").replace("\\", "_")
    name = f"_{name}" if name in ("", ".", "..") else name
    if overrides:
        name = f"{name}--{overrides.replace('/', '_').replace(chr(92), '_')}"
    return _fits(name)


MAX_FOLDER_BYTES = 200  # file systems allow 255 bytes a name; a long negative prompt in the overrides passes that


def _fits(name: str) -> str:
    """`name`, or where it is too long for a folder name, its first bytes and a digest of the whole (so two
    commands still get two folders, and the same command the same folder)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_FOLDER_BYTES:
        return name
    head = raw[:MAX_FOLDER_BYTES - 18].decode("utf-8", "ignore")
    return f"{head}--{hashlib.sha256(raw).hexdigest()[:16]}"


def unit_name(unit: int) -> str:
    """`unit-0000042`: a work unit's file stem (its parquet, done marker and lease)."""
    return f"unit-{unit:07d}"


def unit_shard_pattern(unit: int) -> str:
    """The unit's shard names, for ShardWriter: `shard-u0000042-{index:04d}.tar`."""
    return f"shard-u{unit:07d}-{{index:04d}}.tar"


def unit_shard_glob(unit: int) -> str:
    return f"shard-u{unit:07d}-*.tar"


__all__ = [
    "BATCHING_FILE", "DONE_DIR", "ERRORS_FILE", "INDEX_FILE", "LEASE_DIR", "LOCK_DIR", "LOG_DIR", "MANIFEST_DIR",
    "PLAN_DIR", "PLAN_FILE", "PROGRESS_DIR", "QUARANTINE_DIR", "QUARANTINE_LOG", "RUN_DIRS", "RUN_FILE",
    "RUN_FILES", "SHARD_GLOB", "STAGING_ID_FILE", "STAGING_MARKER_DIR", "SUMMARY_DIR", "SUMMARY_FILE",
    "TIMELINE_DIR", "WORKER_DIR", "run_folder_name", "unit_name", "unit_shard_glob", "unit_shard_pattern",
]
