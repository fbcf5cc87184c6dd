"""GPU: SANA's linear attention three ways, timed and compared with eager bit for bit (issue 28).

    eager      SanaLinearAttnProcessor2_0's ops (ops.LINEAR_ATTENTION.eager): relu, fp32, pad, two cuBLAS
               fp32 matmuls, the division
    fused      ops.LINEAR_ATTENTION's fused form, the job's today: one kernel for the layouts, cuBLAS's
               two products, one kernel for the division
    fma        kernels_linear.linear_attention_fma: two Triton kernels, each product one FMA chain per
               output in k order (equal to eager only where cuBLAS's kernel sums in that order), at
               kernels_linear.TILING

--sweep SHAPES times each of the two kernels alone over its settings (kernels_linear.Tiling), from which
kernels_linear.TILING is picked (session 36 also swept several token blocks a program: slower).

At SANA-1.6B's width (70 heads of 32) and token counts of 512² and 1024² (256, 1024) and more, at
the batches a job runs (CFG doubles them). Also names the cuBLAS kernels eager ran at each shape.

    python benchmarks/probe_linear_attention.py --out benchmarks/results --tag s35
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import device_tag, environment, timed, write_results  # noqa: E402

from bcg.fusions import kernels_linear  # noqa: E402
from bcg.fusions.ops import _EPS, LINEAR_ATTENTION  # noqa: E402


def gemm_kernels(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA" and "gemm" in e.name.lower()})
    return [n[:100] for n in names]


def one_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, reps: int) -> dict:
    row: dict = {}
    with torch.no_grad():
        want = LINEAR_ATTENTION.eager(q, k, v, heads)
        ways = {"eager": lambda: LINEAR_ATTENTION.eager(q, k, v, heads),
                "fused": lambda: LINEAR_ATTENTION.fused(q, k, v, heads),
                "fma": lambda: kernels_linear.linear_attention_fma(q, k, v, heads, _EPS)}
        for name, fn in ways.items():
            try:
                got = fn()
            except Exception as exc:  # noqa: BLE001 - the fused form refuses batch 1
                row[f"{name}_ms"] = None
                row[f"{name}_equal"] = f"{type(exc).__name__}: {exc}"[:80]
                continue
            row[f"{name}_ms"] = round(statistics.median(timed(fn, reps, warm=3)), 4)
            same = torch.equal(got, want) and got.stride() == want.stride()
            diff = float((got.float() - want.float()).abs().max())
            row[f"{name}_equal"] = same or f"{int((got != want).sum())}/{want.numel()} differ, max {diff:.3g}"
        row["cublas"] = "; ".join(gemm_kernels(ways["eager"]))
    return row


def sweep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, reps: int) -> list[dict]:
    """Each kernel's speed settings at one shape, timed alone (the scores kernel; the out kernel on the
    scores it needs), and every setting's bits checked against eager with the other kernel at the
    shape's default (the bits do not depend on the tiling: each output is one FMA chain in k order)."""
    out = []
    B, N, _ = q.shape
    base = kernels_linear.TILING
    with torch.no_grad():
        want = LINEAR_ATTENTION.eager(q, k, v, heads)
        s = kernels_linear.scores(k, v, heads, base)

        def row(kernel: str, t, fn, whole) -> None:
            try:
                fn()
                got = whole()
            except Exception as exc:  # noqa: BLE001 - a setting Triton cannot compile (registers, shared memory)
                out.append(dict(dtype=f"{kernel} {t}", batch=B, tokens=N, fma_ms=None,
                                fma_equal=f"{type(exc).__name__}: {exc}"[:80]))
                print(out[-1], flush=True)
                return
            out.append(dict(dtype=f"{kernel} {t}", batch=B, tokens=N,
                            fma_ms=round(statistics.median(timed(fn, reps, warm=3)), 4),
                            fma_equal=bool(torch.equal(got, want) and got.stride() == want.stride())))
            print(out[-1], flush=True)

        for bk in (16, 32, 64, 128):
            for warps in (1, 2, 4):
                for stages in (2, 3, 4):
                    t = base._replace(bk=bk, scores_warps=warps, scores_stages=stages)
                    row("scores", t, functools.partial(kernels_linear.scores, k, v, heads, t),
                        functools.partial(kernels_linear.linear_attention_fma, q, k, v, heads, _EPS, t))
        for bn in (32, 64, 128, 256):
            for warps in (1, 2, 4, 8):
                t = base._replace(bn=bn, out_warps=warps)
                row("out", t, functools.partial(kernels_linear.attend, q, s, heads, _EPS, t),
                    functools.partial(kernels_linear.linear_attention_fma, q, k, v, heads, _EPS, t))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--shapes", default="2x256,16x256,2x1024,16x1024,32x1024,2x4096,16x4096",
                   help="BATCHxTOKENS,... (batch as the transformer sees it: CFG's two rows an image)")
    p.add_argument("--heads", type=int, default=70)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtypes", default="bfloat16,float16")
    p.add_argument("--tag", default="")
    p.add_argument("--sweep", default="16x1024,16x256",
                   help="shapes at which each fma kernel's tilings (token blocks, warps, stages) are timed, bf16")
    a = p.parse_args()
    rows = []
    D = a.heads * a.head_dim
    for dt_name in a.dtypes.split(","):
        dt = getattr(torch, dt_name)
        for shape in a.shapes.split(","):
            B, N = (int(x) for x in shape.split("x"))
            g = torch.Generator(device="cuda").manual_seed(B * 7919 + N)
            q, k, v = (torch.randn(B, N, D, generator=g, device="cuda").to(dt) for _ in range(3))
            row = dict(dtype=dt_name, batch=B, tokens=N, **one_shape(q, k, v, a.heads, a.reps))
            rows.append(row)
            print(row, flush=True)
    for shape in filter(None, a.sweep.split(",")):
        B, N = (int(x) for x in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(B * 7919 + N)
        q, k, v = (torch.randn(B, N, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
        rows += sweep(q, k, v, a.heads, a.reps)
    cols = ["dtype", "batch", "tokens", "eager_ms", "fused_ms", "fma_ms", "eager_equal", "fused_equal", "fma_equal",
            "cublas"]
    notes = [f"{a.heads} heads of {a.head_dim}; ms: median of {a.reps} calls (CUDA events) after 3; "
             "*_equal: torch.equal and the same strides as eager, else how many elements differ"]
    stem = f"linear_attention_{device_tag()}" + (f"_{a.tag}" if a.tag else "")
    _, m = write_results(a.out, stem, rows, cols, notes, environment())
    print(m.read_text())


if __name__ == "__main__":
    main()
