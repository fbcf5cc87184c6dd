"""The row-walking depthwise 3x3 conv + bias + GLU (kernels.dwconv_glu_rows), run by Triton's
interpreter: the same bits as the gather kernel (kernels.dwconv_glu, row-major taps, which the H200
suite checks against cuDNN: tests/gpu/test_fusions_gpu.py) and as the rounding plan written here in
torch, on grids with edges (rows and columns not multiples of the tile, several column tiles, a
partial channel block, a tile taller than the grid, batch 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The interpreter runs the kernels in numpy: libdevice's exp has no interpreter path (swapped for
# tl.exp, numpy's fp32 exp; the plan's SiLU uses numpy's too), and it truncates fp32 -> bf16, so the
# kernels run in fp16 (numpy's casts round to nearest even, as the GPU's do). TRITON_INTERPRET is read
# when the kernels are defined: a subprocess.
_INTERPRETED = textwrap.dedent("""
    import numpy as np, torch
    import torch.nn.functional as F
    import triton.language as tl
    from triton.language.extra import libdevice
    libdevice.exp = lambda v: tl.exp(v)
    from bcg.fusions import kernels

    def plan(x, w, b):
        # cuDNN's conv: 9 taps row-major in fp32 (half products are exact), stored; aten's bias add,
        # stored; x * silu(gate) with SiLU's result stored
        dt, (B, C2, H, W) = x.dtype, x.shape
        xp, acc = F.pad(x.float(), (1, 1, 1, 1)), torch.zeros(B, C2, H, W)
        for ky in range(3):
            for kx in range(3):
                acc = acc + xp[:, :, ky:ky + H, kx:kx + W] * w.float()[:, 0, ky, kx].view(1, -1, 1, 1)
        d = (acc.to(dt).float() + b.float().view(1, -1, 1, 1)).to(dt).float()
        v, g = d.chunk(2, dim=1)
        silu = (g / (1 + torch.from_numpy(np.exp(-g.numpy())))).to(dt).float()
        return (v * silu).to(dt).contiguous(memory_format=torch.channels_last)

    gen = torch.Generator().manual_seed(0)
    bad = []
    # tiles: rows, columns, channels, warps[, prefetch[, taps as FMAs[, pipeline stages]]] (default True,
    # True, 1; the interpreter runs a pipelined loop as a plain one: the GPU suite checks those bits). fp32's
    # products are not exact, so its walk must not fuse them: the fp32 cases hold the kernel to that
    half, full = torch.float16, torch.float32
    for (B, Hc, H, W), tile, dt in [((2, 24, 5, 7), (2, 8, 16, 4, True), half),
                                    ((1, 16, 9, 20), (4, 16, 16, 4, True), half),
                                    ((2, 40, 6, 3), (8, 32, 32, 4, True), half),
                                    ((1, 8, 1, 1), (8, 32, 32, 4, True), half),
                                    ((2, 24, 5, 7), (2, 8, 16, 4, False), half),
                                    ((1, 16, 9, 20), (4, 16, 16, 4), half),
                                    ((2, 24, 5, 7), (2, 8, 16, 4, True, False), half),
                                    ((1, 16, 9, 20), (4, 16, 16, 4, False, False), half),
                                    ((2, 24, 5, 7), (2, 8, 16, 4, False, True, 3), half),
                                    ((2, 8, 32, 3), None, half),  # the default tile pipelines: 64 image rows
                                    ((2, 40, 6, 3), (8, 32, 32, 4, True, True, 2), half),
                                    ((2, 24, 5, 7), (2, 8, 16, 4, True, True), full), ((1, 16, 9, 20), None, full)]:
        x = (torch.randn(B, H, W, 2 * Hc, generator=gen) * 2).to(dt).permute(0, 3, 1, 2)
        w = (torch.randn(2 * Hc, 1, 3, 3, generator=gen) * 0.5).to(dt)
        b = torch.randn(2 * Hc, generator=gen).to(dt)
        got = kernels.dwconv_glu_rows(x, w, b, tile)
        for name, want in (("gather kernel", kernels.dwconv_glu(x, w, b, False)), ("plan", plan(x, w, b))):
            if not (torch.equal(got, want) and got.is_contiguous(memory_format=torch.channels_last)):
                bad.append(f"{(B, Hc, H, W)} {tile} vs the {name}: {int((got != want).sum())} of {got.numel()} differ")
    print("BAD", bad)
""")


def test_row_walking_kernel_equals_the_gather_kernel_and_the_plan_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BAD []" in r.stdout, r.stdout[-3000:]
