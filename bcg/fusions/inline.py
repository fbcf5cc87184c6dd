"""Inlining an attention module's processor into a fused forward, keeping bcg's attention breaks.

With break_policy "attention" bcg wraps each attention module's forward (an instance attribute,
`__bcg_attention_break__`) so that its attention kernel runs as an eager break under capture. A
fused block that calls the processor's ops itself instead of the module must keep that break: it
runs its attention kernel under `kernel_breaks(attn)`.
"""

from __future__ import annotations

import contextlib

from torch import nn

from ..breaks import _AttentionKernelBreaks
from ..graph import active_capture
from .protocols import Attention


def inlinable(attn: nn.Module | Attention) -> bool:
    """An attention module's processor may be inlined: its forward is the class's, or bcg's
    attention-kernel wrapper (whose breaks `kernel_breaks` keeps)."""
    fwd = attn.__dict__.get("forward")
    return fwd is None or getattr(fwd, "__bcg_attention_break__", False)


def kernel_breaks(attn: nn.Module | Attention) -> contextlib.AbstractContextManager[object]:
    """The context the inlined attention kernel runs in: bcg's breaks where its wrapper is installed
    and a capture runs, else nothing."""
    if "forward" in attn.__dict__ and active_capture() is not None:
        return _AttentionKernelBreaks()
    return contextlib.nullcontext()
