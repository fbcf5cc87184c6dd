"""Where a job's output lives: a local folder, or an object store through fsspec.

    output_dir=/data/synth                 a folder (file:///data/synth is the same folder)
    output_dir=s3://bucket/synth           an object store (gs://, az://, ... with their fsspec package)

With an object store the job works in a *staging folder* on a local (or shared) filesystem, the
same layout a local output_dir has, and keeps the remote copy in step (jobs/output/mirror.py): shards are
committed locally, uploaded whole, then removed locally. The staging folder also holds what an
object store cannot: the lease files that let workers share the plan (they need an atomic
exclusive create and mtimes, jobs/worker/lease.py), the locks and the temps.

So workers share work only when they share the staging folder. Ranks of one torchrun on one node
do (the default staging folder is per output_dir, under `~/.cache/bcgen/staging/`); array tasks
or nodes would each get their own and generate the same units twice, so they are refused unless
`job.staging_dir` names a folder every worker mounts (NFS, Lustre).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from jobs.errors import UserError

STAGING_ENV = "BCGEN_STAGING_ROOT"  # where default staging folders go; XDG's cache otherwise


@dataclass(frozen=True)
class Output:
    """output_dir resolved: `local` is the folder the job writes; `remote` the object store URL, if any."""

    given: str
    local: Path
    remote: Optional[str] = None

    @property
    def shown(self) -> str:
        return self.remote or str(self.local)


def protocol_of(output_dir: str) -> Optional[str]:
    """The URL scheme (`s3`), or None for a plain path. `file://` is a plain path."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", str(output_dir))
    if m is None or m.group(1).lower() in ("file", "local"):
        return None
    return m.group(1).lower()


def local_path(output_dir: str) -> str:
    """The folder a local output_dir names, `~` expanded (Hydra's log folder is resolved from it too)."""
    m = re.match(r"^(?:file|local)://", str(output_dir))
    return os.path.expanduser(str(output_dir)[m.end():] if m else str(output_dir))


def default_staging(url: str, environ: Mapping[str, str] = os.environ) -> Path:
    root = environ.get(STAGING_ENV) or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                     "bcgen", "staging")
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", url)[-60:].strip("_")
    return Path(root) / f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def resolve(output_dir: str, staging_dir: Optional[str]) -> Output:
    """output_dir -> Output; a remote one needs its fsspec implementation installed."""
    proto = protocol_of(output_dir)
    if proto is None:
        return Output(given=output_dir, local=Path(local_path(output_dir)))
    check_protocol(output_dir, proto)
    url = str(output_dir).rstrip("/")
    local = Path(local_path(staging_dir)) if staging_dir else default_staging(url)
    return Output(given=output_dir, local=local, remote=url)


def check_protocol(output_dir: str, proto: str) -> None:
    try:
        import fsspec

        fsspec.get_filesystem_class(proto)
    except ImportError as e:
        extra = "s3" if proto in ("s3", "s3a") else None
        how = (f"pip install -e '.[{extra}]' (fsspec + s3fs)" if extra
               else f"install fsspec's package for {proto}:// ({e})")
        raise UserError(f"output_dir={output_dir!r} needs fsspec's {proto}:// implementation, which is not installed: "
                        f"{how}") from None
    except ValueError as e:
        raise UserError(f"output_dir={output_dir!r}: {proto}:// is not a protocol fsspec knows ({e}); use a local "
                        f"path or an object store URL such as s3://bucket/prefix") from None


def local_dir_of(output_dir: str, staging_dir: Optional[str]) -> str:
    """Hydra's resolver `bcgen_local`: the local folder of output_dir (its logs go there)."""
    return str(resolve(output_dir, staging_dir).local) if protocol_of(output_dir) else local_path(output_dir)


def check_shared_staging(output: Output, staging_dir: Optional[str], task_count: int,
                         environ: Mapping[str, str] = os.environ) -> None:
    """Refuse layouts whose workers could not see each other's leases (see the module docstring)."""
    if output.remote is None or staging_dir:
        return
    world, local_world = environ.get("WORLD_SIZE"), environ.get("LOCAL_WORLD_SIZE")
    nodes = world is not None and local_world is not None and world != local_world
    if task_count > 1 or nodes:
        what = f"{task_count} array tasks / job.partition parts" if task_count > 1 else \
            f"torchrun over several nodes (WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local_world})"
        raise UserError(
            f"output_dir={output.remote!r} is an object store and this job runs as {what}: workers share the plan "
            f"through lease files, which need a filesystem (atomic create, mtimes) that object stores lack, so they "
            f"keep them in a staging folder, by default on this machine only ({output.local}). Set "
            f"job.staging_dir=/a/folder/every/worker/mounts (NFS, Lustre), or run one job per node")


def local_folder_arg(text: str, tool: str) -> Path:
    """The OUTPUT_DIR argument of a tool that reads a local folder (jobs.verify, jobs.inspect)."""
    if protocol_of(text):
        raise UserError(f"{tool} reads a local folder, and {text!r} is an object store: copy the run down first "
                        f"(e.g. `aws s3 sync {text} /tmp/run`, or fsspec's get(recursive=True)), then run "
                        f"`python -m {tool} /tmp/run`")
    return Path(local_path(text))
