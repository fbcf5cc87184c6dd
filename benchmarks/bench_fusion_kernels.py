"""Kernel-level check of two SANA-1.6B fusions on the GPU: bit-exactness against eager, and time.

1. LayerNorm + adaLN (bcg/fusions/kernels_norm.py), alone and with the residual add before it:
   each MEAN_FMA variant against eager (aten LayerNorm, then adaLN's three bf16 ops), on hidden
   states with outlier channels; time against what it replaces (aten LN + the fused adaLN kernel,
   and the residual add before them).
2. The one-pass depthwise 3x3 conv + bias + GLU (kernels.dwconv_glu): a sweep of tiles
   (pixels, channels, warps), each checked equal to cuDNN's conv + the fused bias/GLU kernel,
   timed against that pair.

    python benchmarks/bench_fusion_kernels.py --out benchmarks/results

Shapes are SANA-1.6B's (D = 2240, GLUMBConv 2 x 5600 channels) under CFG (2 rows an image) at
512² and 1024², batch 1 and 4. Times: median of CUDA-event timings of `--iters` back-to-back calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import device_tag, environment  # noqa: E402

D = 2240
HIDDEN = 5600
SHAPES = {"512x1": (2, 256), "1024x1": (2, 1024), "512x4": (8, 256), "1024x4": (8, 1024)}
TILES = [(bp, bc, w) for bp in (16, 32, 64) for bc in (32, 64, 128) for w in (2, 4, 8)]


def timed(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / iters)
    return round(statistics.median(times), 2)


def hidden_states(rows: int, tokens: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, tokens, D, device="cuda", generator=g)
    x[..., :: 97] *= 40  # DiT residual streams carry a few large channels
    return (x * 3 + 0.5).to(torch.bfloat16)


def ln_rows(iters: int) -> list[dict]:
    from bcg.fusions import kernels, kernels_norm

    norm = torch.nn.LayerNorm(D, eps=1e-6, elementwise_affine=False).cuda()
    out = []
    for name, (rows, tokens) in SHAPES.items():
        equal: dict[str, int] = {}
        for seed in range(3):
            x = hidden_states(rows, tokens, seed)
            a = hidden_states(rows, tokens, seed + 100) * 0.1
            scale = torch.randn(rows, 1, D, device="cuda").to(torch.bfloat16) * 0.2
            shift = torch.randn(rows, 1, D, device="cuda").to(torch.bfloat16) * 0.2
            want = norm(x) * (1 + scale) + shift
            h2 = a / 1.0 + x
            want_r = norm(h2) * (1 + scale) + shift
            for v in (0, 1, 2):
                got = kernels_norm.ln_adaln(x, 1e-6, scale, shift, mean_fma=v)
                r, got_r = kernels_norm.ln_adaln(a, 1e-6, scale, shift, residual=x, mean_fma=v)
                equal[f"v{v}"] = equal.get(f"v{v}", 0) + int(torch.equal(got, want))
                equal[f"res_v{v}"] = equal.get(f"res_v{v}", 0) + int(torch.equal(r, h2) and torch.equal(got_r, want_r))
                if seed == 0:
                    equal[f"v{v}_mismatched_elements"] = int((got != want).sum())
        row = {"kernel": "ln_adaln", "shape": name, "rows": rows * tokens, "equal_of_3": equal}
        row["fused_us"] = timed(lambda: kernels_norm.ln_adaln(x, 1e-6, scale, shift), iters)
        row["aten_ln_plus_adaln_us"] = timed(lambda: kernels.adaln(norm(x), scale, shift), iters)
        row["fused_res_us"] = timed(lambda: kernels_norm.ln_adaln(a, 1e-6, scale, shift, residual=x), iters)
        row["add_ln_adaln_us"] = timed(lambda: kernels.adaln(norm(a + x), scale, shift), iters)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


FORMS = [dict(), dict(MEAN_FMA=1), dict(MEAN_FMA=2), dict(ONLINE=1), dict(ONLINE=2), dict(ONLINE=3),
         dict(SIG_FMA=1), dict(RSQ=1), dict(RSQ=2), dict(REDUCE=1), dict(REDUCE=1, MEAN_FMA=1),
         dict(REDUCE=1, MEAN_FMA=2)]


def diagnose(iters: int) -> list[dict]:
    """Which floating-point form of the kernel reproduces aten's per-row mean and rstd
    (torch.ops.aten.native_layer_norm returns both): fp32 rows show every ulp."""
    from bcg.fusions import kernels_norm

    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for D_, rows in ((2240, 2048), (1152, 616), (32, 64)):
            g = torch.Generator(device="cuda").manual_seed(7)
            x = torch.randn(1, rows, D_, device="cuda", generator=g)
            x[..., ::7] *= 30
            x = (x + 0.5).to(dtype)
            z = torch.zeros(1, 1, D_, device="cuda", dtype=dtype)
            want, wm, wr = torch.ops.aten.native_layer_norm(x, [D_], None, None, 1e-6)
            for forms in FORMS:
                f = dict(forms)
                mf = f.pop("MEAN_FMA", 0)
                m = torch.empty(rows, device="cuda")
                rs = torch.empty(rows, device="cuda")
                try:
                    got = kernels_norm.ln_adaln(x, 1e-6, z, z, mean_fma=mf, stats=(m, rs), **f)
                    row = {"dtype": str(dtype).replace("torch.", ""), "D": D_, "rows": rows, "form": forms,
                           "mean_exact": int((m == wm.flatten()).sum()), "rstd_exact": int((rs == wr.flatten()).sum()),
                           "out_equal": bool(torch.equal(got, want))}
                    if D_ == 2240 and dtype == torch.bfloat16:
                        row["us"] = timed(lambda: kernels_norm.ln_adaln(x, 1e-6, z, z, mean_fma=mf, **f), iters)
                except Exception as exc:  # noqa: BLE001
                    row = {"dtype": str(dtype), "D": D_, "form": forms, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


def dw_rows(iters: int) -> list[dict]:
    from bcg.fusions import kernels

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2 * HIDDEN, 2 * HIDDEN, 3, 1, 1, groups=2 * HIDDEN).cuda().to(torch.bfloat16)
    w, bias = conv.weight, conv.bias
    out = []
    for name, (rows, tokens) in SHAPES.items():
        side = int(tokens ** 0.5)
        x = F.silu(torch.randn(rows, side, side, 2 * HIDDEN, device="cuda")).to(torch.bfloat16).permute(0, 3, 1, 2)

        def pair():
            return kernels.bias_glu(F.conv2d(x, w, None, 1, 1, 1, 2 * HIDDEN), bias)

        want = pair()
        row = {"kernel": "dwconv_glu", "shape": name, "cudnn_plus_glu_us": timed(pair, iters),
               "cudnn_conv_us": timed(lambda: F.conv2d(x, w, None, 1, 1, 1, 2 * HIDDEN), iters), "tiles": []}
        for tile in TILES:
            try:
                got = kernels.dwconv_glu(x, w, bias, False, tile)
                eq = bool(torch.equal(got, want))
                us = timed(lambda: kernels.dwconv_glu(x, w, bias, False, tile), iters)
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile is a row too
                eq, us = False, None
                print(f"tile {tile}: {type(exc).__name__}: {exc}", flush=True)
            row["tiles"].append({"tile": list(tile), "us": us, "equal": eq})
        ok = [t for t in row["tiles"] if t["equal"] and t["us"] is not None]
        row["best"] = min(ok, key=lambda t: t["us"]) if ok else None
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tiles"}), flush=True)
    return out


def write(out_dir: Path, rows: list[dict], cmd: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = device_tag()
    (out_dir / f"fusion_kernels_{tag}.json").write_text(json.dumps({"env": environment(), "command": cmd,
                                                                    "rows": rows}, indent=1))
    lines = [f"# fusion_kernels_{tag}", "", f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- command: `{cmd}`", "", "| kernel | shape | equal to eager | fused us | replaces us |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r["kernel"] == "ln_adaln":
            lines.append(f"| ln_adaln | {r['shape']} | {r['equal_of_3']} | {r['fused_us']} / res {r['fused_res_us']} "
                         f"| {r['aten_ln_plus_adaln_us']} / res {r['add_ln_adaln_us']} |")
        else:
            b = r["best"]
            lines.append(f"| dwconv_glu | {r['shape']} | {'all' if all(t['equal'] for t in r['tiles']) else 'some'} "
                         f"| {b['us'] if b else '-'} (tile {b['tile'] if b else '-'}) | {r['cudnn_plus_glu_us']} |")
    (out_dir / f"fusion_kernels_{tag}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--skip", default="", help="comma list: ln, dw")
    p.add_argument("--diagnose", action="store_true", help="only: which kernel form equals aten's LN stats")
    a = p.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    rows = []
    with torch.inference_mode():
        if a.diagnose:
            rows = diagnose(a.iters)
            (Path(a.out) / "ln_diagnosis.json").write_text(json.dumps(rows, indent=1))
            return
        if "ln" not in skip:
            rows += ln_rows(a.iters)
        if "dw" not in skip:
            rows += dw_rows(a.iters)
    write(Path(a.out), rows, "python benchmarks/bench_fusion_kernels.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
