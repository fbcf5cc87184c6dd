"""Which SDPA backend gives a row the same bits alone and in a batch, at the shapes a job makes?

The invariant mode leaves SDPA only its memory-efficient backend (bcg/invariant/mode.py: flash splits
the keys when batch x heads x query blocks is small, cuDNN picks plans by shape). After session 44 the
mode's GEMMs run cuBLAS wherever it gives the canonical bits, and what it still costs in SANA-1.6B's
denoiser is likely that restriction: the default job runs cuDNN's attention for the cross-attention
(job_wall_h200_1024_invariant_s44.md). This probe measures, per backend, whether row 0 alone equals
row 0 of a batch (batch 1 to 16, with CFG where the model has it), and each backend's GPU time:

    sana cross   SANA-1.6B's cross-attention: 20 heads of 112, 1024 (1024²) or 256 (512²) latent
                 queries, a text bucket of keys with an additive mask past the caption (as diffusers'
                 prepare_attention_mask hands it)
    gemma2 self  the Gemma2-2B text encoder's causal self-attention: 8 heads of 256, 300 tokens

    python benchmarks/probe_sdpa_rows.py --out benchmarks/results          # H200: ~1 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import commit, device_tag, environment, graph_ms, write_results  # noqa: E402

# (name, heads, queries, keys, head dim, real keys (the rest masked) or None, causal, rows per prompt)
CASES = [
    ("sana cross 1024² t300", 20, 1024, 300, 112, 47, False, 2),
    ("sana cross 1024² t64", 20, 1024, 64, 112, 20, False, 2),
    ("sana cross 512² t300", 20, 256, 300, 112, 47, False, 2),
    ("gemma2 self t300", 8, 300, 300, 256, None, True, 1),
]
PROMPTS = [1, 2, 4, 8, 16]
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def _inputs(heads, lq, lk, d, real, rows, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(rows, heads, n, d, device="cuda", generator=g).to(torch.bfloat16) for n in (lq, lk, lk))
    mask = None
    if real is not None:  # diffusers: 0 where attended, -10000.0 past the caption, one row of keys a sample
        mask = torch.zeros(rows, 1, 1, lk, device="cuda", dtype=torch.bfloat16)
        mask[..., real:] = -10000.0
    return q, k, v, mask


def case(name, heads, lq, lk, d, real, causal, per_prompt, prompts, backend) -> dict:
    rows = prompts * per_prompt
    q, k, v, mask = _inputs(heads, lq, lk, d, real, rows, seed=lq * 7 + lk)

    def run(n):
        m = None if mask is None else mask[:n]
        with sdpa_kernel([BACKENDS[backend]]):
            return F.scaled_dot_product_attention(q[:n], k[:n], v[:n], attn_mask=m, is_causal=causal)

    row = dict(case=name, backend=backend, prompts=prompts, rows=rows)
    try:
        full = run(rows)
    except RuntimeError as exc:  # the backend does not take this case (a mask, a head dim, ...)
        return dict(row, note=f"unsupported: {str(exc).splitlines()[0][:100]}")
    alone = run(1)
    row.update(equal_alone=bool(torch.equal(full[:1], alone)), ms=round(graph_ms(lambda: run(rows)), 4))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    out = []
    for c in CASES:
        for prompts in PROMPTS:
            for backend in BACKENDS:
                r = case(*c, prompts, backend)
                print(r, flush=True)
                out.append(r)
    ok = [r for r in out if "equal_alone" in r]
    notes = [
        "equal_alone: row 0 of the batch against row 0 computed alone, bitwise, the backend forced "
        "(torch.nn.attention.sdpa_kernel); ms: GPU time of the batch (CUDA-graph replay). bf16, randn inputs.",
        "By backend, rows equal alone: " + ", ".join(
            f"{b} {sum(r['equal_alone'] for r in ok if r['backend'] == b)} of {sum(r['backend'] == b for r in ok)}"
            for b in BACKENDS) + f". Wall {time.time() - t0:.0f} s.",
    ]
    write_results(str(args.out), f"sdpa_rows_{device_tag()}", out,
                  ["case", "backend", "prompts", "rows", "equal_alone", "ms", "note"], notes,
                  dict(environment(), commit=commit()))
    print(notes[-1])


if __name__ == "__main__":
    main()
