"""Opt-in: capture the torch.compile'd forward instead of the eager one (`RunnerConfig.compile`).

At small shapes a DiT step is ~1,000 small kernels and even a graph replay pays a scheduling gap
per kernel; Inductor fuses them into about half as many. The runner's warm-up forwards trigger the
compile (outside any capture), then the compiled kernels are captured and replayed like eager ones.

Contract: replay equals the *compiled* forward bit for bit, not the eager one (Inductor reorders
float math: ~1e-2 relative error on SANA-1.6B bf16), so it is off by default. Only policy "none":
breaks would be traced through by dynamo.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger(__name__)

# Each captured signature is one static-shape compile; the default limit (8) would silently send
# the 9th signature of a long plan to eager Python.
RECOMPILE_LIMIT = 256


def compiled_forward(forward: Callable, policy) -> Callable:
    if policy != "none":
        raise ValueError(f"bcg.compile=true needs break_policy 'none' (got {policy!r}): dynamo would trace "
                         f"through the eager breaks")
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    if getattr(cfg, name) < RECOMPILE_LIMIT:
        setattr(cfg, name, RECOMPILE_LIMIT)
    log.info("bcg: compiling the forward with torch.compile (static shapes, one compile per signature)")
    # dynamic=False: static shapes give the fastest kernels, and the plan's signatures are finite.
    return torch.compile(forward, dynamic=False)
