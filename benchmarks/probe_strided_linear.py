"""A linear over a strided input, its weight trainable (as `from_pretrained` leaves it) or frozen:
which kernels run, whether the bits agree, and the time (jobs/models/weights.py's eval_mode says why).

SANA's attention out-projection takes the linear attention's output as [B, N, D] over [B, D, N]
memory (kernels_linear.attend). With the weight trainable, `torch.matmul` folds that input into a
2-D copy first (ATen's should_fold: for backward's sake, whatever the grad mode), then one GEMM;
frozen, it runs a batched GEMM on the strided layout. bcg/fusions/ops.py's GATED_RESIDUAL_LINEAR
calls exactly `torch.matmul(x, linear.weight.t())`.

    python benchmarks/probe_strided_linear.py --out benchmarks/results

Shapes: SANA-1.6B (D = 2240) under CFG, batch 8 (16 rows) at 512² and 1024². Times: median of five
CUDA-event timings of `--iters` back-to-back calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import back_to_back_us as timed  # noqa: E402
from common import device_tag, environment  # noqa: E402

D = 2240
SHAPES = {"512x8": (16, 256), "1024x8": (16, 1024)}


def kernels_of(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def row(name: str, rows: int, tokens: int, iters: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    linear = torch.nn.Linear(D, D, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(linear.weight, 0, 0.02, generator=g)
    x = torch.randn(rows, D, tokens, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    out = {"shape": name, "x": list(x.shape), "x_stride": list(x.stride())}
    with torch.inference_mode():
        call = lambda: torch.matmul(x, linear.weight.t())  # noqa: E731
        linear.weight.requires_grad_(True)
        trainable = call()
        out["trainable_kernels"] = kernels_of(call)
        out["trainable_us"] = timed(call, iters)
        linear.weight.requires_grad_(False)
        frozen = call()
        out["frozen_kernels"] = kernels_of(call)
        out["frozen_us"] = timed(call, iters)
        out["bits_equal"] = bool(torch.equal(trainable, frozen))
        out["max_abs_diff"] = float((trainable.float() - frozen.float()).abs().max())
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    rows = [row(name, r, t, a.iters) for name, (r, t) in SHAPES.items()]
    tag = device_tag()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    result = {"environment": environment(), "commit": os.environ.get("BENCH_COMMIT", "unknown"),
              "command": " ".join(sys.argv), "rows": rows}
    Path(a.out, f"strided_linear_{tag}.json").write_text(json.dumps(result, indent=1))
    lines = [f"# strided_linear_{tag}: torch.matmul(x [B, N, D] over [B, D, N] memory, W.t()), W trainable vs frozen",
             "", f"- commit `{result['commit']}`; {result['environment']}", f"- command: `{result['command']}`", "",
             "| shape | trainable us | frozen us | bits equal | trainable kernels | frozen kernels |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['trainable_us']} | {r['frozen_us']} | {r['bits_equal']} | "
                     f"{'; '.join(r['trainable_kernels'])} | {'; '.join(r['frozen_kernels'])} |")
    Path(a.out, f"strided_linear_{tag}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
