"""Where does cuBLAS give a row the same bits at any M, and where are its bits the invariant GEMM's?

Issue 30's invariant mode runs every GEMM on bcg.invariant.gemm_triton, 1.3-1.9x cuBLAS's GPU time
(batch_invariant_h200_quick.md), which is most of the mode's 15-25% over a whole job. Two questions
decide whether cuBLAS could run some of those GEMMs without breaking the contract:

1. Is cuBLAS already row-invariant at the M a job makes? For each (N, K) at SANA-1.6B's and Flux's
   widths, `F.linear` on M = rows x tokens (a batch of b images with CFG is 2b rows) against the same
   call on the first sample's rows alone (batch 1 with CFG: 2 x tokens rows).
2. Are cuBLAS's bits the canonical Triton GEMM's? If they were, wherever they agree cuBLAS could
   stand in for the Triton kernel (checked on first sight, as gemm_triton checks its tiles).

Each row of the table is one (model, N, K, M, bias): equal_alone (question 1), equal_triton and the
fraction of differing elements (question 2), and both kernels' GPU ms (CUDA-graph replay).

    python benchmarks/probe_cublas_rows.py --out benchmarks/results          # H200: ~1 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import commit, device_tag, environment, graph_ms, write_results  # noqa: E402

from bcg.invariant.gemm_triton import matmul  # noqa: E402

# (model, N, K, bias, tokens a row): SANA-1.6B at 1024² (32x32 latent tokens) and 512², its
# attention projections (2240 wide), the 1x1 convs of its GLUMBConv (2240 -> 11200, 5600 -> 2240)
# and its caption projection rows (300 text tokens); Flux.1-dev at 1024² (4096 image + 512 text).
WIDTHS = [
    ("sana", 2240, 2240, True, 1024),
    ("sana", 11200, 2240, True, 1024),
    ("sana", 2240, 5600, False, 1024),
    ("sana", 2240, 2240, True, 256),
    ("sana", 11200, 2240, True, 256),
    ("sana", 2240, 5600, False, 256),
    ("sana", 2240, 2304, True, 300),
    ("flux", 3072, 3072, True, 4608),
    ("flux", 12288, 3072, True, 4608),
    ("flux", 3072, 12288, True, 4608),
    ("flux", 3072, 15360, True, 4608),
    ("flux", 21504, 3072, True, 4608),
]
ROWS = [2, 4, 8, 16, 32]  # batch 1, 2, 4, 8, 16 with CFG


def case(model: str, n: int, k: int, has_bias: bool, tokens: int, rows: int) -> dict:
    m = rows * tokens
    g = torch.Generator(device="cuda").manual_seed(n * 31 + k * 7 + m)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    b = (torch.randn(n, device="cuda", generator=g) * 0.02).to(torch.bfloat16) if has_bias else None
    lin = F.linear(x, w, b)
    alone = F.linear(x[: 2 * tokens], w, b)  # batch 1 with CFG
    tri = matmul(x, w.t(), b)
    diff = lin != tri
    row = dict(
        model=model, N=n, K=k, M=m, rows=rows, bias=has_bias,
        equal_alone=bool(torch.equal(lin[: 2 * tokens], alone)),
        equal_triton=bool(torch.equal(lin, tri)),
        differing=round(diff.float().mean().item(), 4),
        max_abs=float((lin.float() - tri.float()).abs().max()),
        cublas_ms=round(graph_ms(lambda: F.linear(x, w, b)), 4),
        triton_ms=round(graph_ms(lambda: matmul(x, w.t(), b)), 4),
    )
    row["triton_vs_cublas"] = round(row["triton_ms"] / row["cublas_ms"], 3)
    del x, w, b, lin, alone, tri, diff
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    out = []
    for model, n, k, has_bias, tokens in WIDTHS:
        for rows in ROWS:
            r = case(model, n, k, has_bias, tokens, rows)
            print(r, flush=True)
            out.append(r)
    cols = ["model", "N", "K", "M", "rows", "bias", "equal_alone", "equal_triton", "differing", "max_abs",
            "cublas_ms", "triton_ms", "triton_vs_cublas"]
    alone = sum(r["equal_alone"] for r in out)
    tri = sum(r["equal_triton"] for r in out)
    notes = [
        "equal_alone: F.linear (cuBLAS) on M rows, its first 2 x tokens rows against the same call on those rows "
        "alone (batch 1 with CFG), bitwise. equal_triton: F.linear against bcg.invariant.gemm_triton.matmul, "
        "bitwise; differing: the fraction of output elements that differ. bf16, inputs randn, weights randn x 0.02.",
        f"cuBLAS row-invariant against batch 1: {alone} of {len(out)}; cuBLAS equal to the invariant GEMM: "
        f"{tri} of {len(out)}. Wall {time.time() - t0:.0f} s.",
    ]
    meta = dict(environment(), commit=commit())
    write_results(str(args.out), f"cublas_rows_{device_tag()}", out, cols, notes, meta)
    print(notes[-1])


if __name__ == "__main__":
    main()
