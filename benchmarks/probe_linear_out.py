"""GPU: candidate forms of the linear attention's second product (kernels_linear._out_kernel), for issue 28.

At SANA-1.6B's 1024², batch 8 (16 CFG rows of 1,024 tokens, 70 heads of 32) the job's `_out_kernel` takes
about 250 us a call, 5 ms of a 92 ms forward (benchmarks/results/profile_fusions_sana_1024_b8_h200_s36.json),
while it moves 147 MB (q in, the output out): a fraction of what the memory allows. Its two `tl.dot`s
(the [C, C] scores by q, and the normaliser row as a block of 16 equal rows, 16 rows of work for one)
lower to FMA chains through Triton's dot layouts. Each form here gives every output the same chain,
fma(s[c, C-1], q[C-1, n], ... fma(s[c, 0], q[0, n], 0)), then the same division, so each must give the
job's bits; this probe checks that against eager (ops.LINEAR_ATTENTION.eager) at each shape:

    today       kernels_linear.attend at kernels_linear.TILING (the job's)
    chain_den   the scores' dot as today, the normaliser as an explicit FMA chain over the 32 channels
                (no 16-row block)
    outer       both as explicit FMA chains: each step one channel of q ([BN] tokens) times one column
                of the scores, an outer-product update of the [C, BN] accumulator (no dot, no layouts)

`--sweep` times each candidate over token blocks and warps. Kept here, not in bcg/, until a device call
shows one equal and faster: then it replaces `_out_kernel` (and the GPU suite runs on that commit).

    python benchmarks/probe_linear_out.py --out benchmarks/results --shapes 16x1024,2x1024,16x256
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bcg.fusions import kernels_linear  # noqa: E402
from bcg.fusions.kernels import OPTS  # noqa: E402
from bcg.fusions.kernels_linear import _relu  # noqa: E402


@triton.jit
def _out_chain_den_kernel(q_ptr, s_ptr, o_ptr, N, D, HEADS, eps, C: tl.constexpr, BN: tl.constexpr):
    # as kernels_linear._out_kernel, with the normaliser row one FMA chain over the channels
    pid = tl.program_id(0).to(tl.int64)
    b = pid // HEADS
    col0 = (pid % HEADS) * C
    cols = tl.arange(0, C)
    base = s_ptr + pid * (C + 1) * C
    s = tl.load(base + cols[:, None] * C + cols[None, :])
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    nm = n < N
    tok = q_ptr + (b * N + n) * D + col0  # each token's first channel of this head
    qt = _relu(tl.load(tok[:, None] + cols[None, :], mask=nm[:, None], other=0.0).to(tl.float32))
    num = tl.dot(s, tl.trans(qt), input_precision="ieee")  # [C, BN]
    den = tl.zeros((BN,), dtype=tl.float32)
    for k in tl.static_range(C):  # channel k of each token: an L1 hit after the tile's load
        qk = _relu(tl.load(tok + k, mask=nm, other=0.0).to(tl.float32))
        den = tl.fma(tl.load(base + C * C + k + n * 0), qk, den)
    out = tl.div_rn(num, (den + eps)[None, :])
    tl.store(o_ptr + (b * D + col0 + cols[:, None]) * N + n[None, :], out.to(o_ptr.dtype.element_ty),
             mask=nm[None, :])


@triton.jit
def _out_outer_kernel(q_ptr, s_ptr, o_ptr, N, D, HEADS, eps, C: tl.constexpr, BN: tl.constexpr):
    # both products as FMA chains over the channels: step k adds s[:, k] x q[k, :] to every output
    pid = tl.program_id(0).to(tl.int64)
    b = pid // HEADS
    col0 = (pid % HEADS) * C
    cols = tl.arange(0, C)
    base = s_ptr + pid * (C + 1) * C
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    nm = n < N
    tok = q_ptr + (b * N + n) * D + col0
    num = tl.zeros((C, BN), dtype=tl.float32)
    den = tl.zeros((BN,), dtype=tl.float32)
    for k in tl.static_range(C):
        qk = _relu(tl.load(tok + k, mask=nm, other=0.0).to(tl.float32))  # [BN]
        sk = tl.load(base + cols * C + k)  # [C]: column k of the scores' C rows
        num = tl.fma(sk[:, None], qk[None, :], num)
        den = tl.fma(tl.load(base + C * C + k + n * 0), qk, den)
    out = tl.div_rn(num, (den + eps)[None, :])
    tl.store(o_ptr + (b * D + col0 + cols[:, None]) * N + n[None, :], out.to(o_ptr.dtype.element_ty),
             mask=nm[None, :])


FORMS = {"chain_den": _out_chain_den_kernel, "outer": _out_outer_kernel}


def attend(form: str, q: torch.Tensor, s: torch.Tensor, heads: int, eps: float, bn: int, warps: int) -> torch.Tensor:
    """kernels_linear.attend's contract in one of FORMS: [B, N, D] in q's dtype (memory [B, D, N])."""
    B, N, D = q.shape
    C = D // heads
    out = torch.empty((B, D, N), dtype=q.dtype, device=q.device)
    FORMS[form][(B * heads, triton.cdiv(N, bn))](q, s, out, N, D, heads, eps, C=C, BN=bn, num_warps=warps, **OPTS)
    return out.transpose(1, 2)


def one_shape(q, k, v, heads: int, reps: int, sweep: bool) -> list[dict]:
    from common import timed

    from bcg.fusions.ops import _EPS, LINEAR_ATTENTION

    B, N, _ = q.shape
    t = kernels_linear.TILING
    want = LINEAR_ATTENTION.eager(q, k, v, heads)
    s = kernels_linear.scores(k, v, heads, t)
    ways = [("today", t.bn, t.out_warps, lambda: kernels_linear.attend(q, s, heads, _EPS, t))]
    settings = [(bn, w) for bn in (32, 64, 128) for w in (1, 2, 4)] if sweep else [(64, 1), (64, 2)]
    for form in FORMS:
        for bn, w in settings:
            ways.append((form, bn, w, lambda form=form, bn=bn, w=w: attend(form, q, s, heads, _EPS, bn, w)))
    rows = []
    for name, bn, w, fn in ways:
        try:
            got = fn()
            ms = round(statistics.median(timed(fn, reps, warm=3)), 4)
            equal = bool(torch.equal(got, want) and got.stride() == want.stride())
        except Exception as exc:  # noqa: BLE001 - a setting Triton cannot compile is a row too
            ms, equal = None, f"{type(exc).__name__}: {exc}"[:80]
        rows.append(dict(form=name, batch=B, tokens=N, bn=bn, warps=w, ms=ms, equal_to_eager=equal))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    from common import device_tag, environment, write_results

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--shapes", default="16x1024,2x1024,16x256", help="BATCHxTOKENS,... (CFG rows)")
    p.add_argument("--heads", type=int, default=70)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="token blocks 32-128 x warps 1-4 for each form")
    p.add_argument("--tag", default="")
    a = p.parse_args()
    rows = []
    with torch.no_grad():
        for shape in a.shapes.split(","):
            B, N = (int(x) for x in shape.split("x"))
            g = torch.Generator(device="cuda").manual_seed(B * 7919 + N)
            q, k, v = (torch.randn(B, N, a.heads * a.head_dim, generator=g, device="cuda").to(torch.bfloat16)
                       for _ in range(3))
            rows += one_shape(q, k, v, a.heads, a.reps, a.sweep)
    notes = [f"{a.heads} heads of {a.head_dim}, bf16; ms: median of {a.reps} calls of the second product alone "
             "(CUDA events) after 3; equal_to_eager: the whole attention with this second product, torch.equal "
             "and the same strides as ops.LINEAR_ATTENTION.eager"]
    stem = f"linear_out_{device_tag()}" + (f"_{a.tag}" if a.tag else "")
    _, m = write_results(a.out, stem, rows, ["form", "batch", "tokens", "bn", "warps", "ms", "equal_to_eager"],
                         notes, environment())
    print(m.read_text())


if __name__ == "__main__":
    main()
