"""benchmarks/kernel_ptx.py compiles a launch for the H200 on the CPU with the JIT's own specialisation:
a channels-last bias + SiLU over 64 channels loads its bias 16 bytes a thread, over 63 channels one
element at a time (the JIT cannot mark 63 divisible by 16), and ptxas reports its registers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytest.importorskip("triton")


def test_the_launch_s_alignment_decides_the_load_width():
    from kernel_ptx import capture

    from bcg.fusions import kernels

    with capture() as rows:
        for channels in (64, 63):  # 64: every row of channels starts 16-byte aligned; 63: no row after the first
            x = torch.empty(2, channels, 4, 4, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
            kernels.bias_silu_(x, torch.empty(channels, dtype=torch.bfloat16))
    aligned, odd = rows
    assert aligned["kernel"] == odd["kernel"] == "_bias_silu_kernel"
    assert aligned["registers"] > 0 and aligned["spill_bytes"] == 0
    assert aligned["memory"].get("ld.global.v4.b32", 0) > 0 and "ld.global.b16" not in aligned["memory"]
    assert odd["memory"].get("ld.global.b16", 0) > 0
