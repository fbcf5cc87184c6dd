"""First-sight verdicts kept across runs: a fused chain or forward found equal (or not) to eager
on one machine is not compared again on the next run with the same key.

    ~/.cache/bcgen/fusions/verdicts-<environment digest>.json    ($BCGEN_CACHE_DIR replaces ~/.cache/bcgen)
    BCGEN_FUSION_CACHE=off                                         no cache (every run verifies)

The file is chosen by everything outside the key that decides bits: the GPU's name, the torch,
CUDA, cuDNN, Triton and diffusers versions, a digest of bcg/fusions' own sources (kernels,
chains, rules), and the batch-invariant mode where it is installed (bcg/invariant: eager then
runs the mode's kernels, its mean and GEMMs and per-sample convolutions, so a chain found equal to
aten's eager says nothing about the mode's): a change to any of them is another file, so every key
verifies again. Inside it a
verdict is keyed by the verifier's key (keys.py: shapes, strides, dtypes, alignment, the rule and
the module's place among the rule's modules).

What a cached verdict skips is the comparison on live values: a kernel that equals eager on the
values of one run is trusted on another's. The kernels here compute every element with the same
operations whatever its value, so values change bits only where the two paths treat NaN, inf or
subnormals apart; the GPU tests cover those. Writes replace the file atomically (a temporary file
and os.replace); two processes writing at once may drop the other's new verdicts, which only
costs a verification on the next run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ENV_DIR = "BCGEN_CACHE_DIR"
ENV_SWITCH = "BCGEN_FUSION_CACHE"
_OFF = ("0", "off", "false", "no")


def cache_root() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "bcgen"


def source_digest() -> str:
    """sha256 of bcg/fusions/*.py: a new kernel or rule is a new cache."""
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def environment() -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - no Triton: the reference backend
        triton_version = None
    try:
        import diffusers

        diffusers_version = diffusers.__version__
    except Exception:  # noqa: BLE001
        diffusers_version = None
    cuda = torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None,
            "triton": triton_version, "diffusers": diffusers_version, "sources": source_digest(),
            "invariant": invariant_mode()}


def invariant_mode() -> dict | None:
    """The installed batch-invariant mode's settings that decide what eager runs, or None. Without it
    in the file's name a default job's verdicts (fused == aten's eager) serve the mode's job, whose
    eager differs: the likely cause of session 44's finding, where the mode's job at SANA-1.6B size gave
    the 16 rows it decoded at batch 4 other images than at batch 8 (a cached verdict there, a fresh one
    against the mode's eager at batch 4; benchmarks/results/job_wall_h200_1024_invariant_s44.md)."""
    from bcg.invariant import active

    mode = active()
    if mode is None:
        return None
    settings = dataclasses.asdict(mode.config)
    settings.pop("fast_paths")  # the vendor kernels give the canonical bytes (bcg/invariant/verified.py)
    return settings


def digest(key: Any) -> str:
    return hashlib.sha1(repr(key).encode()).hexdigest()


class VerdictCache:
    """{key digest: verdict} for one environment, in one JSON file."""

    def __init__(self, path: Path, env: dict | None = None) -> None:
        self.path = path
        self.env = env or {}
        self._verdicts: dict[str, dict] | None = None

    @classmethod
    def default(cls) -> "VerdictCache | None":
        """The user's cache for this environment, or None when BCGEN_FUSION_CACHE is off."""
        if os.environ.get(ENV_SWITCH, "on").strip().lower() in _OFF:
            return None
        env = environment()
        name = hashlib.sha1(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
        return cls(cache_root() / "fusions" / f"verdicts-{name}.json", env)

    def _load(self) -> dict[str, dict]:
        if self._verdicts is None:
            self._verdicts = self._read()
        return self._verdicts

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
            return dict(data.get("verdicts", {}))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # unreadable or torn: start afresh, keep running
            log.warning("bcg.fusions: ignoring the verdict cache %s (%s)", self.path, exc)
            return {}

    def get(self, key: Any) -> bool | None:
        v = self._load().get(digest(key))
        return None if v is None else bool(v["ok"])

    def put(self, key: Any, ok: bool, what: str) -> None:
        verdicts = self._load()
        verdicts[digest(key)] = {"ok": ok, "what": what[:300]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self._read(), **verdicts}  # another process's verdicts since we loaded
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"environment": self.env, "verdicts": merged}, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
            self._verdicts = merged
        except OSError as exc:  # a read-only home: verify again next run, never fail the job
            log.warning("bcg.fusions: cannot write the verdict cache %s (%s)", self.path, exc)
