"""The mode's CUDA kernels: registrations of the Triton GEMM and row reduction for aten ops.

Each takes the cases it covers (float32 / bf16 / fp16, same dtype on both sides) and hands the
rest to aten's `.out` kernel (not replaced, so no recursion), counted as a fallback.
"""

from __future__ import annotations

import torch

from . import conv
from .gemm_triton import matmul
from .reduce_triton import row_sum

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _ok(*ts) -> bool:
    return all(t.dtype == ts[0].dtype for t in ts) and ts[0].dtype in _FLOATS


def register(lib: torch.library.Library, mode, key: str = "CUDA") -> None:
    """Register the kernels for `key` ("CUDA"; the CPU tests pass "CPU" to run them under
    TRITON_INTERPRET=1)."""
    c, calls = mode.config, mode.calls

    def mm(a, b):
        if not _ok(a, b):
            calls["cuda.mm.fallback"] += 1
            return torch.mm(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
        calls["cuda.mm"] += 1
        return matmul(a, b)

    def addmm(bias, a, b, *, beta=1, alpha=1):
        if not _ok(a, b) or bias.dtype not in _FLOATS:
            calls["cuda.addmm.fallback"] += 1
            return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1])))
        calls["cuda.addmm"] += 1
        return matmul(a, b, bias if beta != 0 else None, alpha=alpha, beta=beta)

    def bmm(a, b):
        if not _ok(a, b):
            calls["cuda.bmm.fallback"] += 1
            return torch.bmm(a, b, out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))
        calls["cuda.bmm"] += 1
        return matmul(a, b)

    def baddbmm(bias, a, b, *, beta=1, alpha=1):
        if not _ok(a, b) or bias.dtype not in _FLOATS:
            calls["cuda.baddbmm.fallback"] += 1
            return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha,
                                 out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))
        calls["cuda.baddbmm"] += 1
        full = bias.expand(a.shape[0], a.shape[1], b.shape[2]) if beta != 0 else None
        return matmul(a, b, full, alpha=alpha, beta=beta)

    def gemm_bias(rows, w_t, bias):
        return matmul(rows, w_t, bias) if _ok(rows, w_t) else torch.addmm(bias, rows, w_t) \
            if bias is not None else torch.mm(rows, w_t)

    def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
        if conv.is_pointwise(w, stride, padding, dilation, transposed, groups) and _ok(x, w):
            calls["cuda.convolution.pointwise"] += 1
            return conv.pointwise(x, w, bias, gemm_bias)
        calls["cuda.convolution.per_sample"] += 1
        return conv.per_sample(x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                               canonical=torch.channels_last if key == "CUDA" else torch.contiguous_format)

    def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
        calls["cuda.group_norm"] += 1
        return conv.group_norm_per_sample(x, num_groups, weight, bias, eps)

    def _last_dim(x, dim) -> bool:
        if dim is None or x.dim() == 0:
            return False
        dims = [d % x.dim() for d in dim]
        return dims == [x.dim() - 1] and x.stride(-1) == 1 and x.dtype in _FLOATS

    def row_reduction(name: str, mean: bool):
        """aten's `mean.dim` / `sum.dim_IntList` over the last dim, by the row kernel (the rest: aten)."""
        aten_op = torch.mean if mean else torch.sum

        def impl(x, dim, keepdim=False, *, dtype=None):
            if not _last_dim(x, dim) or (dtype is not None and dtype != x.dtype):
                calls[f"cuda.{name}.fallback"] += 1
                return aten_op(x, dim, keepdim, dtype=dtype, out=x.new_empty(0, dtype=dtype or x.dtype))
            calls[f"cuda.{name}"] += 1
            return row_sum(x, mean=mean, keepdim=keepdim, out_dtype=x.dtype)

        return impl

    if c.gemm:
        lib.impl("mm", mm, key)
        lib.impl("addmm", addmm, key)
        lib.impl("bmm", bmm, key)
        lib.impl("baddbmm", baddbmm, key)
    if c.conv:
        lib.impl("convolution", convolution, key)
    if c.norms:
        lib.impl("group_norm", group_norm, key)
    if c.reductions:
        lib.impl("mean.dim", row_reduction("mean", mean=True), key)
        lib.impl("sum.dim_IntList", row_reduction("sum", mean=False), key)
