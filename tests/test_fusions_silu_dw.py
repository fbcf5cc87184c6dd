"""GLUMBConv's one-pass chain (ops.SILU_DWCONV_GLU) on the CPU: its rounding plan equals the
cuDNN-order chain of aten ops bit for bit, and the Triton kernel (kernels.silu_dwconv_glu), run by
Triton's interpreter, equals that plan on grids with edges (rows and columns not multiples of the
tile, several column tiles and their halo columns, a partial channel block, batch 2), in both of
its shift modes. The H200 check against cuDNN is tests/gpu/test_fusions_gpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bcg.fusions import ops

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hw", [(4, 4), (5, 7)])
def test_plan_equals_the_cudnn_order_chain(dtype, hw):
    """cuDNN runs each conv without its bias and adds the bias in a kernel of its own (aten's
    _convolution); the CPU's oneDNN adds it inside the conv, so the chain is built in cuDNN's order
    from aten ops. The CPU's depthwise conv sums half-precision taps exactly like the plan."""
    torch.manual_seed(0)
    hidden, (H, W) = 16, hw
    conv_inv = nn.Conv2d(8, 2 * hidden, 1).to(dtype)
    conv_dw = nn.Conv2d(2 * hidden, 2 * hidden, 3, 1, 1, groups=2 * hidden).to(dtype)
    x = torch.randn(2, H * W, 8).to(dtype).unflatten(1, (H, W)).permute(0, 3, 1, 2)  # as the block
    with torch.no_grad():
        a = F.silu(F.conv2d(x, conv_inv.weight, None).add_(conv_inv.bias.view(1, -1, 1, 1)))
        d = F.conv2d(a, conv_dw.weight, None, 1, 1, 1, 2 * hidden).add_(conv_dw.bias.view(1, -1, 1, 1))
        want = ops.GLU.eager(d)
        got = ops.SILU_DWCONV_GLU.reference(x, conv_inv, conv_dw)
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype


def test_plan_pads_the_activation_not_the_raw_input():
    """Border outputs see zeros where the grid ends, not silu(bias): a plan that padded the raw
    conv output would differ there (the test above could not tell with a zero bias)."""
    torch.manual_seed(1)
    y = torch.randn(1, 8, 3, 3).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    b_inv, b_dw = torch.full((8,), 2.0, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    w = torch.ones(8, 1, 3, 3, dtype=torch.bfloat16)
    out = ops.silu_dw_glu_plan(y, b_inv, w, b_dw)
    a = F.silu(y + b_inv.view(1, -1, 1, 1))
    d = F.conv2d(F.pad(a, (1, 1, 1, 1)), w, None, 1, 0, 1, 8)  # zero-padded activation
    assert torch.equal(out, ops.GLU.eager(d))


def test_fp32_and_other_convs_are_not_applicable():
    conv_inv, conv_dw = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 3, 1, 1, groups=8)
    x = torch.randn(1, 4, 3, 3)
    with pytest.raises(ops.NotApplicable, match="fp16"):
        ops.SILU_DWCONV_GLU.reference(x, conv_inv, conv_dw)
    with pytest.raises(ops.NotApplicable, match="depthwise"):
        ops.SILU_DWCONV_GLU.reference(x.half(), conv_inv.half(), nn.Conv2d(8, 8, 3, 1, 1).half())


# Triton's interpreter runs the kernel in numpy: libdevice's exp has no interpreter path (it is
# swapped for tl.exp, numpy's fp32 exp, and the plan is given the same SiLU), and it truncates
# fp32 -> bf16 (fp16 casts are numpy's, round-to-nearest-even), so the kernel runs in fp16 here.
# It runs in a subprocess: TRITON_INTERPRET is read when the kernels are defined.
_INTERPRETED = textwrap.dedent("""
    import numpy as np, torch
    import triton.language as tl
    from triton.language.extra import libdevice
    libdevice.exp = lambda v: tl.exp(v)
    from bcg.fusions import kernels, ops

    def silu(v):
        return v / (1 + torch.from_numpy(np.exp(-v.numpy())))

    g = torch.Generator().manual_seed(0)
    bad = []
    # tiles: rows, columns, channels, warps, shift by dot[, prefetch the next row[, taps as FMAs]] (both
    # flags default True)
    for (B, Hc, H, W), tile in [((2, 24, 5, 7), (2, 16, 16, 4, True)), ((2, 24, 5, 7), (3, 16, 16, 4, False)),
                                ((1, 16, 9, 20), (4, 16, 16, 4, True, True)),
                                ((1, 16, 6, 20), (4, 16, 16, 4, False, True)),
                                ((1, 16, 9, 20), (4, 16, 16, 4, True, False)),
                                ((2, 24, 5, 7), (3, 16, 16, 4, False, False)),
                                ((1, 16, 9, 20), (4, 16, 16, 4, True, True, False)),
                                ((2, 24, 5, 7), (3, 16, 16, 4, False, False, False))]:
        y = (torch.randn(B, H, W, 2 * Hc, generator=g) * 2).half().permute(0, 3, 1, 2)
        b_inv, b_dw = torch.randn(2 * Hc, generator=g).half(), torch.randn(2 * Hc, generator=g).half()
        w = (torch.randn(2 * Hc, 1, 3, 3, generator=g) * 0.5).half()
        want = ops.silu_dw_glu_plan(y, b_inv, w, b_dw, silu=silu)
        got = kernels.silu_dwconv_glu(y, b_inv, w, b_dw, tile)
        if not (torch.equal(got, want) and got.stride() == want.stride()):
            bad.append(f"{(B, Hc, H, W)} {tile}: {int((got != want).sum())} of {got.numel()} differ")
    print("BAD", bad)
""")


def test_kernel_under_the_triton_interpreter_equals_the_plan():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BAD []" in r.stdout, r.stdout[-3000:]
