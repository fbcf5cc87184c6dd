"""A vendor kernel where it gives the canonical kernel's bits: checked once per call shape.

The mode's canonical kernels (the Triton GEMM, the per-sample convolution) are batch-invariant by
construction, and slower than cuBLAS and cuDNN at the shapes a job makes (1.3-2.4x for the GEMMs,
benchmarks/results/cublas_rows_h200.md). But where a vendor kernel's reduction is the canonical one's
(one fp32 accumulator walked over K in the same MMA k-steps, no split-K), its output is the same bits,
and on the H200 cuBLAS's was at every SANA-1.6B and Flux GEMM of 512 to 147,456 rows measured there.
So the mode may run the vendor kernel for a call shape once it has seen the two agree, and the
canonical kernel everywhere else: the bytes are the canonical kernel's either way, so the contract
holds whichever runs, and a shape's verdict is only a speed choice.

Why one look per shape is enough: cuBLAS and cuDNN pick a kernel (and with it the order of every
sum) from the problem's dtype, shape, strides and alignment, never from the values, and the choice is
deterministic (cuDNN's benchmark is off in the mode). The verdict's key is therefore exactly those,
the batch included: the same key is the same kernel. Its test runs both kernels on the call's own
operands and on random operands of the same key (a private generator, so no sample's seed moves),
and accepts only if both are bit-equal: real operands alone could agree by accident (zero weights,
padding rows), random ones cannot over thousands of outputs unless every sum was made the same way.

Until a key is decided (its first call inside a CUDA graph capture, which cannot compare) the
canonical kernel runs. Thread-safe: the job's stages run on threads of their own.

Verdicts outlive the run where the mode's installer hands them a file (kept.py): a kept "agree" is
used once the vendor kernel's output on the key's probe operands matches the checksum kept with it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from .kept import checksum

if TYPE_CHECKING:
    from .kept import KeptVerdicts

log = logging.getLogger(__name__)

Kernel = Callable[..., torch.Tensor]


def layout(t: Optional[torch.Tensor]) -> Optional[tuple]:
    """What a vendor library picks its kernel from: dtype, device, shape, strides, 16-byte alignment."""
    if t is None:
        return None
    return (t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.data_ptr() % 16)


def math_settings() -> tuple:
    """Process-wide switches that let cuBLAS and cuDNN compute the same key another way (TF32,
    reduced-precision split reductions): part of every verdict's key, so a switch flipped mid-run
    decides its shapes anew rather than trusting a verdict made under the other setting."""
    m = torch.backends.cuda.matmul
    return tuple(getattr(m, f, None) for f in ("allow_tf32", "allow_bf16_reduced_precision_reduction",
                                                "allow_fp16_reduced_precision_reduction")) \
        + (torch.backends.cudnn.allow_tf32,)


def random_like(t: Optional[torch.Tensor], gen: torch.Generator) -> Optional[torch.Tensor]:
    """Random normal values in a tensor of `t`'s `layout` (its strides and alignment kept: a view
    into a fresh buffer at the same offset modulo 16 bytes). An integer or boolean operand (an
    attention mask) comes back as it is: its values say which terms a sum has, not what they are
    (probe_operands fills a boolean one)."""
    if t is None or not (t.is_floating_point() or t.is_complex()):
        return t
    return _same_layout(t, lambda buf: buf.normal_(generator=gen))


def span(t: torch.Tensor) -> int:
    """Elements from t's first to its last in memory (its numel where t is dense); 0 for an empty t."""
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0


def _same_layout(t: torch.Tensor, fill: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """A view of `t`'s shape and strides into a fresh buffer `fill` writes, at t's offset modulo 16 bytes
    (what `layout` keys on)."""
    offset = (t.data_ptr() % 16) // t.element_size()
    buf = torch.empty(span(t) + offset, dtype=t.dtype, device=t.device)
    fill(buf)
    return buf.as_strided(t.shape, t.stride(), offset)


#: the probe's seed: a private generator, the same in every run (kept.py re-checks a kept verdict on it)
PROBE_SEED = 0x5EED


def probe_operands(operands: Sequence[Optional[torch.Tensor]]) -> list:
    """The key's probe: random values in each floating operand's layout from a generator seeded with
    PROBE_SEED (so the same in every run, and no sample's seed moves); a boolean operand (an attention
    mask) all True in its layout, since random ones could mask a whole row (NaN, never equal to itself)
    and the call's own differ from call to call; any other operand as it is."""
    device = next((t.device for t in operands if t is not None), torch.device("cpu"))
    gen = torch.Generator(device=device).manual_seed(PROBE_SEED)
    return [_same_layout(t, lambda buf: buf.fill_(True)) if t is not None and t.dtype == torch.bool
            else random_like(t, gen) for t in operands]


def _capturing(operands: Sequence[Optional[torch.Tensor]]) -> bool:
    return any(t is not None and t.device.type == "cuda" for t in operands) and \
        torch.cuda.is_current_stream_capturing()


class Verdicts:
    """Per key, whether `fast` gave `canonical`'s bits; found on the key's first call outside a capture,
    or recalled from a kept file (kept.py) where one is attached."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._agrees: dict = {}
        self._lock = threading.Lock()
        self._kept: Optional["KeptVerdicts"] = None
        self._recalled = 0

    def keep_in(self, kept: Optional["KeptVerdicts"]) -> None:
        """Keep new verdicts in `kept`, and recall verdicts from it (None: this run's only)."""
        self._kept = kept

    def run(self, key: tuple, canonical: Kernel, fast: Kernel,
            operands: Sequence[Optional[torch.Tensor]]) -> tuple[bool, torch.Tensor]:
        """(whether `fast` ran, the canonical bytes): `fast(*operands)` where the key is known to
        agree, else `canonical(*operands)`, deciding the key on its first call."""
        verdict = self._agrees.get(key)
        if verdict:
            return True, fast(*operands)
        if verdict is False or _capturing(operands):
            return False, canonical(*operands)
        recalled = self._recall(key, fast, operands)
        if recalled is not None:
            return (True, fast(*operands)) if recalled else (False, canonical(*operands))
        want = canonical(*operands)
        agrees, fingerprint = self._agree(canonical, fast, operands, want, self._kept is not None)
        with self._lock:
            self._agrees[key] = agrees
        if self._kept is not None:
            self._kept.keep(self.name, key, agrees, fingerprint)
        if not agrees:
            log.info("bcg.invariant: %s differs from the canonical kernel at %s; the canonical kernel runs there",
                     self.name, key)
        return False, want

    def _recall(self, key: tuple, fast: Kernel, operands) -> Optional[bool]:
        """A kept verdict for `key`, an "agree" only once `fast` reproduced its fingerprint; None where
        there is none (or it failed the check: the caller decides the key again)."""
        store = self._kept
        kept = store.recall(self.name, key) if store is not None else None
        if store is None or kept is None:
            return None
        ok = bool(kept["ok"])
        if ok and checksum(fast(*probe_operands(operands))) != kept.get("fingerprint"):
            log.warning("bcg.invariant: %s no longer gives the kept fingerprint at %s (%s); deciding it again",
                        self.name, key, store.file.path)
            return None
        with self._lock:
            self._agrees[key] = ok
            self._recalled += 1
        return ok

    @staticmethod
    def _agree(canonical: Kernel, fast: Kernel, operands, want: torch.Tensor,
               fingerprint: bool = False) -> tuple[bool, Optional[list]]:
        """Whether `fast` gave the canonical bits on the call's operands and on the probe's; with
        `fingerprint`, the checksum of its output on the probe (kept.py keeps it with the verdict)."""
        if not torch.equal(fast(*operands), want):
            return False, None
        probe = probe_operands(operands)
        got = fast(*probe)
        if not torch.equal(got, canonical(*probe)):
            return False, None
        return True, checksum(got) if fingerprint else None

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._agrees)

    def counts(self) -> dict:
        """{"agree": keys where the vendor kernel runs, "differ": keys where the canonical one does,
        "kept": how many of them were recalled from an earlier run's file instead of decided}."""
        snap = self.snapshot()
        return {"agree": sum(snap.values()), "differ": len(snap) - sum(snap.values()), "kept": self._recalled}


GEMM = Verdicts("cuBLAS's GEMM")
CONV = Verdicts("cuDNN's batched convolution")
ATTENTION = Verdicts("SDPA's batched call")


def keep_in(kept: Optional["KeptVerdicts"]) -> None:
    """Hand the fast paths' verdicts a kept file (the mode's installer), or take it back (None)."""
    for verdicts in (GEMM, CONV, ATTENTION):
        verdicts.keep_in(kept)
