"""Batch-invariant transcendental elementwise ops on the CPU (silu, gelu, tanh, sigmoid, exp).

aten's CPU loops run 2 x SIMD-width elements at a time through the vectorised (Sleef) function and
the remainder of each thread's range through the scalar (libm) one, and the two round differently.
Where a row's elements fall (vector body or scalar tail) follows the tensor's numel and the thread
split, so the batch: Wan's timestep embedding, silu over [1, 24] against [16, 24], gave row 0 other
bits (benchmarks/results/batch_invariance_cpu.md). Here the input is copied flat into a zero-padded
buffer whose length is a multiple of 64 x lcm(1..threads) elements: every thread's range is then
a whole number of vector steps (64 covers fp32 and bf16 on AVX512), so every element goes through
the vectorised function, whichever batch it is in. Exact ops (add, mul, div, sqrt) need none of this.
"""

from __future__ import annotations

import math
from functools import reduce

import torch

STEP = 64  # elements: 2 x the widest SIMD vector aten uses (AVX512 bf16: 32 lanes)


def _quantum() -> int:
    t = max(1, torch.get_num_threads())
    return STEP * reduce(math.lcm, range(1, t + 1), 1)


def padded_unary(out_op, x: torch.Tensor, **kw) -> torch.Tensor:
    """out_op(input, out=...) (an aten `.out` overload) on x, every element through the vector path."""
    n = x.numel()
    q = _quantum()
    flat = torch.zeros(-(-n // q) * q if n else 0, dtype=x.dtype, device=x.device)
    flat[:n] = x.reshape(-1)
    res = torch.empty_like(flat)
    out_op(flat, **kw, out=res)
    return res[:n].view(x.shape)


OPS = {  # aten op -> its out overload
    "silu": torch.ops.aten.silu.out,
    "gelu": torch.ops.aten.gelu.out,
    "tanh": torch.ops.aten.tanh.out,
    "sigmoid": torch.ops.aten.sigmoid.out,
    "exp": torch.ops.aten.exp.out,
}
