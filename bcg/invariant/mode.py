"""The batch-invariant mode: aten's batch-sensitive kernels replaced, process-wide, while installed.

Installed with `torch.library` (kernels registered for the CPU and CUDA dispatch keys), not a
`TorchDispatchMode`: a dispatch mode is per thread, and the job runs encode, denoise and decode
on threads of its own; a registration holds for every thread and costs no Python mode stack. It
is also what CUDA graph capture records (the replacements are plain kernel launches). Removal
destroys the registrations, and aten's kernels are back.

What is replaced, and why (benchmarks/results/batch_invariance_cpu.md measured the CPU side):
- mm, addmm, bmm, baddbmm (so linear, matmul, einsum): BLAS/cuBLAS pick kernels by M. CPU:
  fixed-shape calls of aten's own kernels (cpu.py); CUDA: the Triton GEMM (gemm_triton.py).
- convolution: algorithms picked by minibatch and layout. Per sample, contiguous; on CUDA a 1x1
  one as a GEMM (conv.py). group_norm: per sample likewise.
- CPU silu/gelu/tanh/sigmoid/exp: vector body vs scalar tail picked by numel (elementwise.py).
- CPU scaled_dot_product_attention: a pipeline that pads a batch to its longest row (Z-Image)
  hands a row masked keys it does not have alone, and the flash kernel's sums over the keys then
  run in other blocks. Item by item, each item's keys cut after the last one it attends (cpu.sdpa).
- CUDA mean/sum over the last dim (RMSNorm): launch picked by the number of rows (reduce_triton.py).
- CUDA attention: flash attention splits the keys when batch x heads x query blocks is small, and
  cuDNN attention picks plans by shape. Each row a call of its own, or the whole batch in one call
  where that gave the same bits (attention.py), under a fixed backend order: cuDNN, memory-efficient,
  math; flash off, process-wide, while on.

Every replacement falls back to aten's `.out` kernel (not replaced) for what it does not cover
(dtypes other than float32/bf16/fp16, ...), and the counters say how often: a fallback is a place
where the contract may not hold.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from . import attention, conv, cpu, elementwise, verified
from .kept import KeptVerdicts

log = logging.getLogger(__name__)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_lock = threading.Lock()
_active: Optional["BatchInvariance"] = None


@dataclass
class InvariantConfig:
    """What the mode replaces (every field on by default: the contract needs them all)."""

    gemm: bool = True
    """mm / addmm / bmm / baddbmm, and so every linear and matmul."""
    conv: bool = True
    """aten::convolution: per sample, or a 1x1 one as a GEMM (CUDA)."""
    norms: bool = True
    """group_norm: per sample (its CPU kernel splits the work by N x groups)."""
    elementwise: bool = True
    """CPU: silu / gelu / tanh / sigmoid / exp through the vectorised path only (elementwise.py)."""
    attention_cpu: bool = True
    """CPU scaled_dot_product_attention: item by item, its masked-out trailing keys cut (cpu.sdpa)."""
    reductions: bool = True
    """CUDA: sum / mean over the last dimension (the CPU's reductions were measured invariant)."""
    attention: Literal["rows", "efficient", "keep"] = "rows"
    """CUDA SDPA. "rows": each row in a call of its own under a fixed backend order (cuDNN first), the
    whole batch in one call where that gave the same bits (attention.py). "efficient": only the
    memory-efficient and math backends on, batched (one program a query block over all keys; the
    mode's attention before session 45, 2.6x slower than cuDNN's at SANA-1.6B's cross-attention on the
    H200; other bytes than "rows"). "keep": SDPA left as it is (rows may follow their batch)."""
    fast_paths: bool = True
    """CUDA: run cuBLAS's GEMM / cuDNN's batched convolution / attention's batched call at each call
    shape where, on first sight, they gave the canonical kernel's bits (on the call's operands and on
    random ones of its layout), the canonical kernel elsewhere (verified.py). The bytes are the same
    either way; off is slower."""
    cuda: Literal["auto", "off"] = "auto"
    """"auto": also register the CUDA kernels when CUDA is available (needs Triton); "off": CPU only."""
    cpu_rows: int = cpu.ROWS
    """Rows per fixed-shape call on the CPU (any value is invariant; it trades memory for calls)."""


class BatchInvariance:
    """The installed mode: its registrations, the SDPA flags it changed, and counters."""

    def __init__(self, config: Optional[InvariantConfig] = None) -> None:
        self.config = config or InvariantConfig()
        self.calls: Counter = Counter()  # "cpu.mm", "cuda.addmm", "cuda.mean.fallback", ...
        self._lib: Optional[torch.library.Library] = None
        self._sdp: Optional[dict] = None
        self.devices: list = []

    # -- install / remove ---------------------------------------------------------------------
    def install(self) -> "BatchInvariance":
        global _active
        with _lock:
            if _active is not None:
                raise RuntimeError("bcg.invariant: the batch-invariant mode is already installed; "
                                   "remove() the one installed before installing another")
            cuda = self.config.cuda == "auto" and torch.cuda.is_available()
            if cuda:
                try:
                    from . import cuda_ops
                except ImportError as exc:
                    raise RuntimeError(f"bcg.invariant: the CUDA kernels need Triton ({exc}); "
                                       "pip install triton, or set cuda='off' (then CUDA runs stay batch-variant)"
                                       ) from exc
            lib = torch.library.Library("aten", "IMPL")
            try:
                with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
                    warnings.filterwarnings("ignore", message="Warning only once for all operators")
                    self._register_cpu(lib)
                    if cuda:
                        cuda_ops.register(lib, self)
                if cuda:
                    self.devices.append("cuda")
                    if self.config.attention != "keep":
                        self._sdp = attention.switch(self.config.attention)
                    if self.config.fast_paths:  # verdicts of earlier runs, re-checked (kept.py)
                        verified.keep_in(KeptVerdicts.default(self.config))
            except Exception:
                lib._destroy()
                raise
            self._lib = lib
            self.devices.insert(0, "cpu")
            _active = self
        log.info("bcg.invariant: batch-invariant kernels installed (%s)", ", ".join(self.devices))
        return self

    def remove(self) -> None:
        global _active
        with _lock:
            if self._lib is None:
                return
            self._lib._destroy()
            self._lib = None
            if self._sdp is not None:
                attention.restore(self._sdp)
                self._sdp = None
            verified.keep_in(None)
            self.devices = []
            if _active is self:
                _active = None

    def __enter__(self) -> "BatchInvariance":
        return self.install() if self._lib is None else self

    def __exit__(self, *exc) -> None:
        self.remove()

    @property
    def installed(self) -> bool:
        return self._lib is not None

    def stats(self) -> dict:
        """Installed, devices, each kernel's calls; with CUDA, how many call shapes the vendor kernels (and
        attention's batched call) ran (agree) and how many the canonical ones (differ), verified.py's verdicts."""
        out: dict = {"installed": self.installed, "devices": list(self.devices), "calls": dict(self.calls)}
        if "cuda" in self.devices and self.config.fast_paths:
            out["fast_paths"] = {"gemm": verified.GEMM.counts(), "convolution": verified.CONV.counts()}
            if self.config.attention == "rows":
                out["fast_paths"]["attention"] = verified.ATTENTION.counts()
        return out

    # -- the CPU kernels ------------------------------------------------------------------------
    def _register_cpu(self, lib: torch.library.Library) -> None:
        c, rows, calls = self.config, self.config.cpu_rows, self.calls

        def gemm2d(a, b, bias=None, beta=1, alpha=1):
            y = cpu.mm(a, b, rows)
            if alpha != 1:
                y = y * alpha
            if bias is not None and beta != 0:  # aten's addmm ignores the bias (even NaN) for beta 0
                y = y + (bias if beta == 1 else bias * beta)
            return y

        def mm(a, b):
            if a.dtype not in _FLOATS or b.dtype != a.dtype:
                calls["cpu.mm.fallback"] += 1
                return torch.mm(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
            calls["cpu.mm"] += 1
            return cpu.mm(a, b, rows)

        def addmm(bias, a, b, *, beta=1, alpha=1):
            if a.dtype not in _FLOATS or b.dtype != a.dtype:
                calls["cpu.addmm.fallback"] += 1
                return torch.addmm(bias, a, b, beta=beta, alpha=alpha,
                                   out=a.new_empty((a.shape[0], b.shape[1])))
            calls["cpu.addmm"] += 1
            return gemm2d(a, b, bias, beta, alpha).to(a.dtype)

        def bmm(a, b):
            if a.dtype not in _FLOATS or b.dtype != a.dtype:
                calls["cpu.bmm.fallback"] += 1
                return torch.bmm(a, b, out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))
            calls["cpu.bmm"] += 1
            return cpu.bmm(a, b, rows)

        def baddbmm(bias, a, b, *, beta=1, alpha=1):
            if a.dtype not in _FLOATS or b.dtype != a.dtype:
                calls["cpu.baddbmm.fallback"] += 1
                return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha,
                                     out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))
            calls["cpu.baddbmm"] += 1
            y = cpu.bmm(a, b, rows)
            if alpha != 1:
                y = y * alpha
            if beta != 0:
                y = y + (bias if beta == 1 else bias * beta)
            return y.to(a.dtype)

        def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
            calls["cpu.convolution"] += 1
            return conv.per_sample(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)

        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
            # Registered for AutogradCPU too (a composite op has no CPU kernel of its own to reach
            # outside inference mode); where a gradient is wanted, aten's composite runs instead,
            # above autograd, so the backward is aten's (the contract is an inference one).
            grad = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (q, k, v, attn_mask))
            if (grad or q.dtype not in _FLOATS or dropout_p != 0 or q.dim() < 3 or q.is_nested
                    or (attn_mask is not None and attn_mask.dim() > q.dim())):
                calls["cpu.sdpa.fallback"] += 1
                return cpu.sdpa_aten(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            calls["cpu.sdpa"] += 1
            return cpu.sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

        def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
            calls["cpu.group_norm"] += 1
            return conv.group_norm_per_sample(x, num_groups, weight, bias, eps)

        if c.gemm:
            lib.impl("mm", mm, "CPU")
            lib.impl("addmm", addmm, "CPU")
            lib.impl("bmm", bmm, "CPU")
            lib.impl("baddbmm", baddbmm, "CPU")
        if c.conv:
            lib.impl("convolution", convolution, "CPU")
        if c.norms:
            lib.impl("group_norm", group_norm, "CPU")
        if c.attention_cpu:
            lib.impl("scaled_dot_product_attention", sdpa, "CPU")
            lib.impl("scaled_dot_product_attention", sdpa, "AutogradCPU")
        if c.elementwise:
            for name, out_op in elementwise.OPS.items():
                lib.impl(name, _unary(name, out_op, calls), "CPU")


def _unary(name, out_op, calls):
    def impl(x, **kw):
        if x.dtype not in _FLOATS:
            calls[f"cpu.{name}.fallback"] += 1
            res = torch.empty_like(x)
            out_op(x, **kw, out=res)
            return res
        calls[f"cpu.{name}"] += 1
        return elementwise.padded_unary(out_op, x, **kw)

    return impl


def active() -> Optional[BatchInvariance]:
    """The installed mode, if any."""
    return _active


def install_batch_invariance(config: Optional[InvariantConfig] = None) -> BatchInvariance:
    """Install the mode process-wide; `.remove()` the returned object to take it away."""
    return BatchInvariance(config).install()


def batch_invariant(config: Optional[InvariantConfig] = None) -> BatchInvariance:
    """`with batch_invariant(): ...`: the mode for the block's duration."""
    return BatchInvariance(config)
