"""benchmarks/kernel_ptx.py compiles a launch for the H200 on the CPU with the JIT's own specialisation:
a channels-last bias + SiLU over 64 channels loads its bias 16 bytes a thread, over 63 channels one
element at a time (the JIT cannot mark 63 divisible by 16), and ptxas reports its registers; the
machine code's loops are counted, and the warps an SM holds worked out."""

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


def test_the_fma_taps_shorten_the_depthwise_walk_s_loop():
    """The SASS loop count sees what session 58's FMA taps did to the row walk: each of the 18 taps of an
    output element one instruction where it was two (a multiply and an add), so a trip issues at least
    18 fewer for every element a thread holds (here 8 x 32 elements over 128 threads: 2; at the job's
    tile 4, where the loop went from 370 to 291), with no spills either way."""
    from kernel_ptx import capture

    from bcg.fusions import kernels

    x = torch.empty(2, 2 * 64, 8, 8, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w, b = torch.empty(2 * 64, 1, 3, 3, dtype=torch.bfloat16), torch.empty(2 * 64, dtype=torch.bfloat16)
    with capture() as rows:
        for fma in (True, False):
            kernels.dwconv_glu_rows(x, w, b, (8, 16, 32, 4, True, fma, 1))
    fused, plain = rows
    assert (fused["constexprs"]["FMA"], plain["constexprs"]["FMA"]) == (True, False)
    assert len(fused["loop_instructions"]) == len(plain["loop_instructions"]) == 1  # the row walk
    per_thread = 8 * 32 // (4 * 32)  # BW (the grid's 8 columns) x BC over 4 warps' threads
    assert plain["loop_instructions"][0] - fused["loop_instructions"][0] >= 18 * per_thread, (fused, plain)
    assert fused["spill_bytes"] == plain["spill_bytes"] == 0


def test_warps_an_sm_holds():
    """sm_90's occupancy arithmetic, against Nsight Compute's reading of the depthwise walk on an H100
    (164 registers, 4 warps: 3 blocks by registers, 12 warps) and the limits' other corners."""
    from kernel_ptx import warps_per_sm

    assert warps_per_sm(164, 4, 0) == 12
    assert warps_per_sm(161, 4, 0) == warps_per_sm(168, 4, 0) == 12  # a thread's registers round up to 8
    assert warps_per_sm(32, 4, 0) == 64  # the warp limit
    assert warps_per_sm(16, 1, 0) == 32  # the block limit
    assert warps_per_sm(128, 1, 14336) == 15  # shared memory binds: 228 KB over 14 KB + 1 KB
