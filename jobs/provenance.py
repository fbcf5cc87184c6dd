"""Where an output came from: when, with which software, on which device, at which quality tier.

    provenance(fusions, compile_, device)   {"time", "bcgen", "git_commit", "torch", "cuda", "diffusers",
                                             "transformers", "python", "host", "device", "gpu", "quality_tier"}

Volatile on purpose: a rerun on another host, a newer torch or later in the day is the same run.
So it never enters the run's identity (jobs/plan/identity.py): run.json carries it under its own
`provenance` key, which the claim leaves out of the comparison (jobs/output/claim.py), and
summary.json carries the latest job's, with its start and end.

A job that renders nothing (`python -m jobs.plan`) has no device, and imports no torch: its
`device`, `gpu` and `cuda` are null, and torch's version is its package's.
"""

from __future__ import annotations

import datetime
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional

CHECKOUT = Path(__file__).resolve().parent.parent  # the source tree, when bcgen runs from a checkout


def now_iso() -> str:
    """UTC, to the second, ISO 8601: sorts as it reads."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit(root: Path = CHECKOUT) -> Optional[str]:
    """The checkout's commit (`+dirty` when tracked files changed); None for an installed wheel."""
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # no git on this host: the version alone says what ran
    return head + ("+dirty" if dirty else "")


def quality_tier(fusions: str, compile_: bool) -> str:
    """bcg.fusions, as the run's images depend on it (compile changes pixels as `fast` does)."""
    return "fast" if compile_ and fusions != "fast" else fusions


def provenance(fusions: str, compile_: bool, device: Optional[str]) -> dict:
    """`device`: the torch device the job renders on ("cpu", "cuda", "cuda:1"); None for a job that
    renders nothing."""
    torch_version, cuda, gpu = _version("torch"), None, None
    if device is not None:
        import torch  # a rendering job has it loaded already

        torch_version, cuda = torch.__version__, torch.version.cuda
        if device.startswith("cuda") and torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(torch.device(device))
    return {
        "time": now_iso(),
        "bcgen": _version("bcgen"),
        "git_commit": git_commit(),
        "torch": torch_version,
        "cuda": cuda,
        "diffusers": _version("diffusers"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "device": device,
        "gpu": gpu,
        "quality_tier": quality_tier(fusions, compile_),
    }
