"""The fast paths' verdicts kept across runs, each re-checked on first use by its fingerprint.

A verdict (verified.py) costs a run its first sight of every call shape: the canonical kernel and
the vendor kernel on the call's operands, then on random ones. On the H200 at SANA-1.6B size the
mode's first batch came 2.2-2.3 s after the default job's and its signature switches took 0.8-0.9 s
more, while its steady batch cost 2.8-3.4% more (benchmarks/results/job_wall_h200_*_invariant_s46.md):
at 200 prompts what a run pays once is most of what the mode costs, and first sights are likely most
of that. So a verdict is kept in the user's cache,

    <user cache>/invariant/verdicts-<environment digest>.json     BCGEN_INVARIANT_CACHE=off: decide every run

in a file named by everything outside the key that decides either kernel's bits: each kind of GPU
visible (name, compute capability, SM count: cuBLAS's heuristics read it), torch, CUDA, cuDNN and Triton
versions, the cuBLAS and cuDNN wheels where pip installed them, the BLAS library torch prefers, the
environment variables cuBLAS, cuDNN and torch's BLAS path read, bcg/invariant's own sources and the
mode's settings. The key itself holds the rest (shape, strides, dtype, alignment, math settings).

A kept "differ" is used as it is: it only makes the canonical kernel run, which gives the canonical
bytes by construction. A kept "agree" is not taken on trust, since it lets the vendor kernel's bytes
stand for the canonical ones: on the key's first call in a run the vendor kernel runs once on the
key's probe operands (verified.probe_operands: seeded random values in the call's layout, so the same
in every run) and its output's checksum must equal the one kept, which was the canonical kernel's
there too when the verdict was made. That costs one vendor call on the probe and a checksum, where
deciding costs the canonical kernel twice and the vendor kernel twice (the call's operands, the probe).
A mismatch (a library swapped under the same version strings, a file edited or torn) is logged and
the key is decided again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from bcg.verdict_file import VerdictFile, environment_file, sources_digest, switched_off

log = logging.getLogger(__name__)

ENV_SWITCH = "BCGEN_INVARIANT_CACHE"

#: environment variables whose prefix marks them as read by cuBLAS, cuDNN or torch's BLAS dispatch
#: (workspace sizes, cuBLASLt on or off, TF32 overrides): any of them may change the kernel a shape gets
VENDOR_VARIABLES = ("CUBLAS", "CUDNN", "TORCH_CUDNN", "TORCH_BLAS", "TORCH_CUBLAS", "DISABLE_ADDMM_CUDA_LT",
                    "NVIDIA_TF32_OVERRIDE")

#: the pip wheels that carry cuBLAS and cuDNN beside torch (their versions can move without torch's)
VENDOR_WHEELS = ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cudnn-cu13",
                 "nvidia-cudnn-cu12")

#: elements a checksum reads at a time (int16 lanes): bounds its transient memory to tens of MB
CHUNK = 1 << 22


def source_digest() -> str:
    """sha256 of bcg/invariant/*.py: another canonical kernel is another file."""
    return sources_digest(Path(__file__).parent)


def _wheel_versions() -> dict:
    found = {}
    for name in VENDOR_WHEELS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _gpus() -> list:
    """The kinds of GPU visible (name, compute capability, SM count), each once: eight of one kind and one
    of it are the same environment."""
    if not torch.cuda.is_available():
        return []
    kinds = set()
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        kinds.add((p.name, f"{p.major}.{p.minor}", p.multi_processor_count))
    return [list(k) for k in sorted(kinds)]


def environment(config: Any) -> dict:
    """Everything outside a key that decides the canonical or the vendor kernel's bits."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - no Triton: CPU only, where nothing is verified
        triton_version = None
    settings = dataclasses.asdict(config)
    settings.pop("fast_paths", None)  # only on with them: they are what is kept
    blas = getattr(torch.backends.cuda, "preferred_blas_library", None)
    return {"gpus": _gpus(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "triton": triton_version, "wheels": _wheel_versions(),
            "blas": str(blas()) if blas is not None and torch.cuda.is_available() else None,
            "variables": {k: v for k, v in sorted(os.environ.items()) if k.startswith(VENDOR_VARIABLES)},
            "sources": source_digest(), "mode": settings}


def checksum(t: torch.Tensor) -> list:
    """Three exact integer sums over t's bytes read as int16 lanes in memory order: plain, weighted by a
    repeating ramp, and squared; and the lane count. Integer sums give the same value in any order, and
    any changed bit changes the plain sum unless another change cancels it exactly. On a CUDA device
    one Triton pass computes them (checksum_triton.py); elsewhere, and for odd-sized elements (uint8
    lanes), torch does, a chunk at a time. Both give the same integers, so a fingerprint kept by either
    is checked by the other."""
    flat = _memory_order(t)
    lanes = flat.view(torch.int16) if flat.element_size() % 2 == 0 else flat.view(torch.uint8)
    if lanes.is_cuda and lanes.dtype == torch.int16 and lanes.numel():
        return _checksum_triton(lanes)
    return _checksum_torch(lanes)


def _checksum_torch(lanes: torch.Tensor) -> list:
    """checksum's integers from 1-D lanes, a chunk at a time, so no int64 copy of a large output is made;
    each chunk's three sums fit an int64 (4M lanes of at most 2^15 squared), and they are read back to the
    host once, at the end, and added up as Python ints, so no total overflows. One read-back, not three a
    chunk: a first sight's check of a large output (399 chunks at SANA-1.6B size) waited on the device
    1,197 times, holding the host back from issuing the first batch's work
    (benchmarks/results/job_wall_trace_512_16_s54.md)."""
    n = lanes.numel()
    steps = torch.arange(min(n, CHUNK), device=lanes.device, dtype=torch.int64)
    sums = []
    for i in range(0, n, CHUNK):
        c = lanes[i:i + CHUNK].to(torch.int64)
        ramp = (steps[:c.numel()] + i) % 251 + 1  # lane i's weight, whatever the chunking
        sums.append(torch.stack([c.sum(), (c * ramp).sum(), (c * c).sum()]))
    totals = [sum(column) for column in zip(*torch.stack(sums).tolist())] if sums else [0, 0, 0]
    return [*totals, n]


def _checksum_triton(lanes: torch.Tensor) -> list:
    """checksum's integers from 1-D int16 lanes on a CUDA device: one Triton launch per 2^32 lanes, its
    partial sums added in int64 on the device, all read back at once and added up as Python ints."""
    from bcg.invariant.checksum_triton import lane_sums

    totals = [sum(column) for column in zip(*torch.stack(lane_sums(lanes)).tolist())]
    return [*totals, lanes.numel()]


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """t's elements as a 1-D view in the order they lie in memory, where t is dense (its strides a
    permutation of a contiguous tensor's); a contiguous copy otherwise."""
    if t.numel() == 0:
        return t.reshape(-1)
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1)
    expect = 1
    for st, s in dims:
        if st != expect:
            return t.contiguous().reshape(-1)
        expect *= s
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


class KeptVerdicts:
    """One file's verdicts for the fast paths of one process (verified.Verdicts asks it)."""

    def __init__(self, file: VerdictFile) -> None:
        self.file = file

    @classmethod
    def default(cls, config: Any) -> Optional["KeptVerdicts"]:
        """The user's file for this environment and mode, or None where BCGEN_INVARIANT_CACHE is off."""
        if switched_off(ENV_SWITCH):
            return None
        env = environment(config)
        return cls(VerdictFile(environment_file("invariant", env), env))

    def recall(self, name: str, key: tuple) -> Optional[dict]:
        """The kept record of `key` under `name` ({"ok", "fingerprint"}), or None."""
        return self.file.entry((name, key))

    def keep(self, name: str, key: tuple, ok: bool, fingerprint: Optional[list]) -> None:
        self.file.put((name, key), ok, f"{name} at {key}", fingerprint=fingerprint)
