"""libdevice under Triton's interpreter (TRITON_INTERPRET=1), for the scripts that run the fused kernels on
the CPU: libdevice has no interpreter path, so its functions are swapped for numpy's (tanh, exp) or
Triton's (rsqrt: 1 / sqrt). Call `swap()` before the kernels are imported; the plans the scripts compare
with use the same functions (tests/interpreted_kernels.py's `np_silu`, `rsqrt`)."""

from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.interpreter import TensorHandle


def _np_unary(fn):
    return lambda v: tl.core.tensor(TensorHandle(fn(v.handle.data), v.handle.dtype.scalar), v.type)


def swap() -> None:
    libdevice.tanh = _np_unary(np.tanh)
    libdevice.exp = _np_unary(np.exp)
    libdevice.rsqrt = lambda v: tl.rsqrt(v)
