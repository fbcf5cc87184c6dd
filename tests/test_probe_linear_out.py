"""benchmarks/probe_linear_out.py's candidate second products of the linear attention, run by Triton's
interpreter against kernels_linear.attend (the job's) on a grid with edges (tokens not a multiple of the
block, two heads, batch 2). The interpreter computes a dot with numpy's matmul and an FMA in two
roundings, so the bits are the H200's to check (the probe compares them with eager); here: every output
in its place, within fp32 rounding."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_INTERPRETED = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, "benchmarks")
    import probe_linear_out as P
    from bcg.fusions import kernels_linear as KL

    g = torch.Generator().manual_seed(0)
    B, N, heads, C = 2, 37, 2, 16
    q, k, v = (torch.randn(B, N, heads * C, generator=g).half() for _ in range(3))
    s = KL.scores(k, v, heads, KL.TILING)
    want = KL.attend(q, s, heads, 1e-15, KL.TILING).float()
    bad = []
    for form in P.FORMS:
        for bn, warps in ((16, 1), (32, 2)):
            got = P.attend(form, q, s, heads, 1e-15, bn, warps)
            if got.shape != want.shape or got.stride() != KL.attend(q, s, heads, 1e-15, KL.TILING).stride():
                bad.append(f"{form} {bn}: layout {got.shape} {got.stride()}")
            elif not torch.allclose(got.float(), want, rtol=2e-3, atol=1e-3):
                bad.append(f"{form} {bn}: max diff {float((got.float() - want).abs().max()):.3g}")
    print("BAD", bad)
""")


def test_candidate_second_products_put_every_output_in_place_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BAD []" in r.stdout, r.stdout[-3000:]
