"""The mode's CUDA kernels: registrations of the Triton GEMM and row reduction for aten ops.

Each takes the cases it covers (float32 / bf16 / fp16, same dtype on both sides) and hands the
rest to aten's `.out` kernel (not replaced, so no recursion), counted as a fallback.

With `InvariantConfig.fast_paths` (the default) a GEMM runs on cuBLAS, and a convolution on cuDNN's
batched kernel, at each call shape where they gave the canonical kernel's bits on first sight
(verified.py): the same bytes, at the vendor kernel's speed. Counted as `cuda.<op>.cublas` and
`cuda.convolution.batched` (a subset of `cuda.<op>` / beside `cuda.convolution.per_sample`).

With `InvariantConfig.attention == "rows"` (the default) scaled_dot_product_attention computes each row
in a call of its own, or the whole batch in one where that gave the same bits (attention.py), counted as
`cuda.sdpa` and its subset `cuda.sdpa.batched`.
"""

from __future__ import annotations

import torch

from . import attention, conv, verified
from .gemm_triton import matmul
from .reduce_triton import row_sum

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _ok(*ts) -> bool:
    return all(t.dtype == ts[0].dtype for t in ts) and ts[0].dtype in _FLOATS


def _aten_mm(a, b):
    return torch.mm(a, b, out=a.new_empty((a.shape[0], b.shape[1])))


def _aten_bmm(a, b):
    return torch.bmm(a, b, out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))


def register(lib: torch.library.Library, mode, key: str = "CUDA") -> None:
    """Register the kernels for `key` ("CUDA"; the CPU tests pass "CPU" to run them under
    TRITON_INTERPRET=1)."""
    c, calls = mode.config, mode.calls

    def verified_gemm(op: str, canonical, fast, operands, *params, counter: str = ""):
        """canonical(*operands), or fast(*operands) where the key gave the same bits (verified.py);
        a fast call counts as `counter` (default `cuda.<op>.cublas`, a subset of `cuda.<op>`)."""
        if not c.fast_paths:
            return canonical(*operands)
        shape_key = (op, params, verified.math_settings(), *map(verified.layout, operands))
        ran_fast, out = verified.GEMM.run(shape_key, canonical, fast, operands)
        if ran_fast:
            calls[counter or f"cuda.{op}.cublas"] += 1
        return out

    def mm(a, b):
        if not _ok(a, b):
            calls["cuda.mm.fallback"] += 1
            return torch.mm(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
        calls["cuda.mm"] += 1
        return verified_gemm("mm", matmul, _aten_mm, (a, b))

    def addmm(bias, a, b, *, beta=1, alpha=1):
        if not _ok(a, b) or bias.dtype not in _FLOATS:
            calls["cuda.addmm.fallback"] += 1
            return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1])))
        calls["cuda.addmm"] += 1
        return verified_gemm(
            "addmm", lambda x, p, q: matmul(p, q, x if beta != 0 else None, alpha=alpha, beta=beta),
            lambda x, p, q: torch.addmm(x, p, q, beta=beta, alpha=alpha, out=p.new_empty((p.shape[0], q.shape[1]))),
            (bias, a, b), beta, alpha)

    def bmm(a, b):
        if not _ok(a, b):
            calls["cuda.bmm.fallback"] += 1
            return torch.bmm(a, b, out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))
        calls["cuda.bmm"] += 1
        return verified_gemm("bmm", matmul, _aten_bmm, (a, b))

    def baddbmm(bias, a, b, *, beta=1, alpha=1):
        if not _ok(a, b) or bias.dtype not in _FLOATS:
            calls["cuda.baddbmm.fallback"] += 1
            return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha,
                                 out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))
        calls["cuda.baddbmm"] += 1

        def canonical(x, p, q):
            full = x.expand(p.shape[0], p.shape[1], q.shape[2]) if beta != 0 else None
            return matmul(p, q, full, alpha=alpha, beta=beta)

        return verified_gemm(
            "baddbmm", canonical,
            lambda x, p, q: torch.baddbmm(x, p, q, beta=beta, alpha=alpha,
                                          out=p.new_empty((p.shape[0], p.shape[1], q.shape[2]))),
            (bias, a, b), beta, alpha)

    def gemm_bias(rows, w_t, bias):
        """A 1x1 convolution's GEMM: addmm's path (the mode's) where it is covered."""
        if not _ok(rows, w_t):
            return torch.addmm(bias, rows, w_t) if bias is not None else torch.mm(rows, w_t)
        counter = "cuda.convolution.pointwise.cublas"  # a subset of cuda.convolution.pointwise
        if bias is None:
            return verified_gemm("mm", matmul, _aten_mm, (rows, w_t), counter=counter)
        return verified_gemm("addmm", lambda x, p, q: matmul(p, q, x),
                             lambda x, p, q: torch.addmm(x, p, q, out=p.new_empty((p.shape[0], q.shape[1]))),
                             (bias, rows, w_t), 1, 1, counter=counter)

    def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
        if conv.is_pointwise(w, stride, padding, dilation, transposed, groups) and _ok(x, w):
            calls["cuda.convolution.pointwise"] += 1
            return conv.pointwise(x, w, bias, gemm_bias)
        params = (tuple(stride), tuple(padding), tuple(dilation), transposed, tuple(output_padding), groups)
        canonical_format = torch.channels_last if key == "CUDA" else torch.contiguous_format

        def per_sample(xx, ww, bb):
            return conv.per_sample(xx, ww, bb, *params, canonical=canonical_format)

        def batched(xx, ww, bb):
            return conv.batched(xx, ww, bb, *params, canonical=canonical_format)

        if c.fast_paths and x.shape[0] > 1:
            ran_fast, out = verified.CONV.run(("convolution", params, verified.math_settings(),
                                               *map(verified.layout, (x, w, bias))),
                                              per_sample, batched, (x, w, bias))
            calls["cuda.convolution.batched" if ran_fast else "cuda.convolution.per_sample"] += 1
            return out
        calls["cuda.convolution.per_sample"] += 1
        return per_sample(x, w, bias)

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
        # Registered for the Autograd key too (a composite op is reached there outside inference
        # mode); where a gradient is wanted aten's composite runs, so the backward is aten's.
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, attn_mask))
        if grad or not attention.covered(q, k, v, attn_mask, dropout_p):
            calls["cuda.sdpa.fallback"] += 1
            return attention.composite(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        calls["cuda.sdpa"] += 1

        def per_row(qq, kk, vv, mm):
            return attention.per_row(qq, kk, vv, mm, dropout_p, is_causal, scale, enable_gqa)

        def batched(qq, kk, vv, mm):
            return attention.composite(qq, kk, vv, mm, dropout_p, is_causal, scale, enable_gqa)

        if not c.fast_paths or q.shape[0] == 1:
            return per_row(q, k, v, attn_mask)
        shape_key = ("sdpa", dropout_p, is_causal, scale, enable_gqa, attention.settings(),
                     *map(verified.layout, (q, k, v, attn_mask)))
        ran_fast, out = verified.ATTENTION.run(shape_key, per_row, batched, (q, k, v, attn_mask))
        if ran_fast:
            calls["cuda.sdpa.batched"] += 1  # a subset of cuda.sdpa
        return out

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
            if not mean and not x.is_floating_point() and not x.is_complex() \
                    and (dtype is None or not (dtype.is_floating_point or dtype.is_complex)):
                # an integer or boolean sum is exact in any order (transformers' masks count their
                # tokens so): aten's, and not a fallback, which would warn that rows may move
                calls[f"cuda.{name}.exact"] += 1
                return torch.sum(x, dim, keepdim, dtype=dtype, out=x.new_empty(0, dtype=dtype or torch.int64))
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
    if c.attention == "rows":
        lib.impl("scaled_dot_product_attention", sdpa, key)
        lib.impl("scaled_dot_product_attention", sdpa, "Autograd" + key)
