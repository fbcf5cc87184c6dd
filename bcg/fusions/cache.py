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
subnormals apart; the GPU tests cover those. The file itself (atomic writes, a torn file ignored,
a read-only folder tolerated) is bcg/verdict_file.py's, shared with the batch-invariant mode's
fast paths (bcg/invariant/kept.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from bcg.verdict_file import ENV_DIR, VerdictFile, cache_root, environment_file, sources_digest, switched_off

__all__ = ["ENV_DIR", "ENV_SWITCH", "VerdictCache", "cache_root", "environment", "source_digest"]

ENV_SWITCH = "BCGEN_FUSION_CACHE"


def source_digest() -> str:
    """sha256 of bcg/fusions/*.py: a new kernel or rule is a new cache."""
    return sources_digest(Path(__file__).parent)


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


class VerdictCache(VerdictFile):
    """{key digest: verdict} for one environment, in one JSON file (bcg/verdict_file.py)."""

    @classmethod
    def default(cls) -> "VerdictCache | None":
        """The user's cache for this environment, or None when BCGEN_FUSION_CACHE is off."""
        if switched_off(ENV_SWITCH):
            return None
        env = environment()
        return cls(environment_file("fusions", env), env)
