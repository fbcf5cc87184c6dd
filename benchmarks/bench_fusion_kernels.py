"""Kernel-level check of fusions on the GPU (SANA-1.6B's, and Z-Image's RMSNorm variance): bit-exactness
against eager, and time.

1. LayerNorm + adaLN (bcg/fusions/kernels_norm.py), alone and with the residual add before it:
   each MEAN_FMA variant against eager (aten LayerNorm, then adaLN's three bf16 ops), on hidden
   states with outlier channels; time against what it replaces (aten LN + the fused adaLN kernel,
   and the residual add before them).
2. The one-pass depthwise 3x3 conv + bias + GLU (kernels.dwconv_glu): a sweep of tiles
   (pixels, channels, warps), each checked equal to cuDNN's conv + the fused bias/GLU kernel,
   timed against that pair.
   `dw_rows`: the row-walking kernel (kernels.dwconv_glu_rows, each input row read once) over a
   sweep of tiles, each checked equal to that pair; both timed as CUDA-graph replays.
3. `silu_dw`: GLUMBConv up to conv_point (1x1 conv, bias, SiLU, depthwise 3x3, bias, GLU) as eager
   runs it, as today's fused paths run it (1x1 conv + bias_silu_, then cuDNN's depthwise conv +
   bias_glu or the one-pass dwconv_glu) and as the 1x1 conv + kernels.silu_dwconv_glu over a sweep
   of tiles; each checked equal to eager. Timed as CUDA-graph replays of 20 calls (no Python
   launch overhead, as the job's graphs run them).
4. `row_var`: Z-Image's RMSNorm variance (kernels_rms.row_variance) at its 1024² shapes, a sweep of
   tiles (rows a program, warps, unrolled loop), each checked equal to aten's `x.float().pow(2).mean(-1)`,
   timed as CUDA-graph replays beside those two aten kernels.

    python benchmarks/bench_fusion_kernels.py --out benchmarks/results
    python benchmarks/bench_fusion_kernels.py --only dw_rows --out benchmarks/results
    python benchmarks/bench_fusion_kernels.py --only silu_dw --out benchmarks/results
    python benchmarks/bench_fusion_kernels.py --only row_var --out benchmarks/results
    python benchmarks/bench_fusion_kernels.py --only rope --out benchmarks/results

Shapes are SANA-1.6B's (D = 2240, GLUMBConv 2 x 5600 channels) under CFG (2 rows an image) at
512² and 1024², batch 1 and 4 (and 8 for LayerNorm + adaLN, the job's). Times: median of CUDA-event timings of
`--iters` back-to-back calls; LayerNorm + adaLN and the sweeps: of CUDA-graph replays (`graph_timed`).
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

from common import back_to_back_us as timed  # noqa: E402
from common import device_tag, environment  # noqa: E402

D = 2240
HIDDEN = 5600
SHAPES = {"512x1": (2, 256), "1024x1": (2, 1024), "512x4": (8, 256), "1024x4": (8, 1024),
          "1024x8": (16, 1024)}  # the job's batch of 8 at 1024²
TILES = [(bp, bc, w) for bp in (16, 32, 64) for bc in (32, 64, 128) for w in (2, 4, 8)]
# rows, columns, channels, warps, prefetch the next row, taps as FMAs, pipeline stages (kernels.dw_rows_tile).
# Session 41's sweep found the prefetch faster at every shape, session 58's first the FMA taps (3-10%, one
# H100); this one times Triton's software pipelining of the walk's loads (1 stage: none) with and without
# the hand-written prefetch; and the default without FMAs, for reference
ROWS_TILES = ([(r, cols, c, w, pf, True, st) for st in (1, 2, 3, 4) for pf in (True, False)
               for r, cols, c, w in ((32, 16, 32, 4), (16, 16, 32, 4), (32, 16, 64, 8), (32, 32, 16, 4),
                                     (32, 16, 16, 4))] + [(32, 16, 32, 4, True, False)])


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
        gate = torch.randn(rows, 1, D, device="cuda").to(torch.bfloat16) * 0.2
        r_g, got_g = kernels_norm.ln_adaln(a, 1e-6, scale, shift, residual=x, gate=gate)
        h_g = x + gate * a
        equal["gate"] = int(torch.equal(r_g, h_g) and torch.equal(got_g, norm(h_g) * (1 + scale) + shift))
        # CUDA-graph replays, as the job runs them: a Python launch costs about as much as the kernel
        # at these sizes, so back-to-back eager calls (`timed`) measured the launch (session 39)
        row = {"kernel": "ln_adaln", "shape": name, "rows": rows * tokens, "equal_of_3": equal}
        row["fused_us"] = graph_timed(lambda: kernels_norm.ln_adaln(x, 1e-6, scale, shift))
        row["aten_ln_plus_adaln_us"] = graph_timed(lambda: kernels.adaln(norm(x), scale, shift))
        row["fused_res_us"] = graph_timed(lambda: kernels_norm.ln_adaln(a, 1e-6, scale, shift, residual=x))
        row["add_ln_adaln_us"] = graph_timed(lambda: kernels.adaln(norm(a + x), scale, shift))
        row["fused_gate_us"] = graph_timed(lambda: kernels_norm.ln_adaln(a, 1e-6, scale, shift, residual=x,
                                                                         gate=gate))
        # bytes moved a call over the time: x (and the residual's two inputs, its output) and the output
        row["fused_res_tb_s"] = round(4 * x.numel() * x.element_size() / row["fused_res_us"] / 1e6, 2)
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


def dw_cases():
    """(shape, x, weight, bias, pair) a shape: GLUMBConv's depthwise input (channels-last, after SiLU)
    and cuDNN's depthwise conv + the fused bias/GLU kernel, the default path the kernels replace."""
    from bcg.fusions import kernels

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2 * HIDDEN, 2 * HIDDEN, 3, 1, 1, groups=2 * HIDDEN).cuda().to(torch.bfloat16)
    w, bias = conv.weight, conv.bias
    for name, (rows, tokens) in SHAPES.items():
        side = int(tokens ** 0.5)
        x = F.silu(torch.randn(rows, side, side, 2 * HIDDEN, device="cuda")).to(torch.bfloat16).permute(0, 3, 1, 2)
        yield name, x, w, bias, lambda x=x: kernels.bias_glu(F.conv2d(x, w, None, 1, 1, 1, 2 * HIDDEN), bias)


def dw_rows(iters: int) -> list[dict]:
    from bcg.fusions import kernels

    out = []
    for name, x, w, bias, pair in dw_cases():
        want = pair()
        row = {"kernel": "dwconv_glu", "shape": name, "cudnn_plus_glu_us": timed(pair, iters),
               "cudnn_conv_us": timed(lambda: F.conv2d(x, w, None, 1, 1, 1, 2 * HIDDEN), iters), "tiles": []}
        sweep(row, TILES, lambda tile: kernels.dwconv_glu(x, w, bias, False, tile), want,
              lambda f: timed(f, iters))
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tiles"}), flush=True)
    return out


def dw_walk_rows() -> list[dict]:
    """kernels.dwconv_glu_rows (walks rows, each input row read once) against cuDNN's depthwise conv +
    the bias/GLU kernel, both as CUDA-graph replays, over ROWS_TILES."""
    from bcg.fusions import kernels

    out = []
    for name, x, w, bias, pair in dw_cases():
        want = pair()
        walk = {"kernel": "dwconv_glu_rows", "shape": name, "cudnn_plus_glu_graph_us": graph_timed(pair),
                "default_tile": list(kernels.dw_rows_tile(x.shape[2], x.shape[0])), "tiles": []}
        sweep(walk, ROWS_TILES, lambda tile: kernels.dwconv_glu_rows(x, w, bias, tile), want, graph_timed)
        out.append(walk)
        print(json.dumps({k: v for k, v in walk.items() if k != "tiles"}), flush=True)
    return out


def sweep(row: dict, tiles, run, want: torch.Tensor, time_fn) -> None:
    """Each tile's `run(tile)` against `want` (bits) and its time into row["tiles"]; row["best"]: the
    fastest equal tile. A tile that does not compile is a row too."""
    for tile in tiles:
        try:
            eq = bool(torch.equal(run(tile), want))
            us = time_fn(lambda: run(tile))
        except Exception as exc:  # noqa: BLE001
            eq, us = False, None
            print(f"tile {tile}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        row["tiles"].append({"tile": list(tile), "us": us, "equal": eq})
    ok = [t for t in row["tiles"] if t["equal"] and t["us"] is not None]
    row["best"] = min(ok, key=lambda t: t["us"]) if ok else None


def graph_timed(fn, calls: int = 20, reps: int = 7) -> float:
    """us a call: `calls` calls captured into one CUDA graph, replayed; median of `reps` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (Triton compiles, cuDNN picks) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    del graph
    return round(statistics.median(times), 2)


SILU_DW_SHAPES = {"512x1": (2, 16), "1024x1": (2, 32), "1024x4": (8, 32), "1024x8": (16, 32)}  # CFG rows, side
# rows, columns, channels, warps, shift by dot, prefetch the next row (kernels.SILU_DW_TILE); each (tile,
# grid width) compiles once
SILU_DW_TILES = ([(r, 32, c, w, True, pf) for pf in (True, False) for r in (8, 16, 32)
                  for c, w in ((32, 4), (64, 4), (64, 8))]
                 + [(r, 32, c, w, False, True) for r in (8, 16) for c, w in ((32, 4), (64, 8))]
                 + [(8, 16, 32, 4, True, True), (16, 16, 32, 4, True, True)])


def silu_dw_rows() -> list[dict]:
    from bcg.fusions import kernels, ops

    torch.manual_seed(0)
    dt = torch.bfloat16
    conv_in = torch.nn.Conv2d(D, 2 * HIDDEN, 1).cuda().to(dt)
    conv_dw = torch.nn.Conv2d(2 * HIDDEN, 2 * HIDDEN, 3, 1, 1, groups=2 * HIDDEN).cuda().to(dt)
    w_in, b_in, w_dw, b_dw = conv_in.weight, conv_in.bias, conv_dw.weight, conv_dw.bias
    out = []
    for name, (rows, side) in SILU_DW_SHAPES.items():
        # as the block makes it: LN + adaLN output [B, N, D] viewed as a channels-last [B, D, h, w]
        x = torch.randn(rows, side * side, D, device="cuda").to(dt).unflatten(1, (side, side)).permute(0, 3, 1, 2)
        raw = F.conv2d(x, w_in, None)

        def eager():
            return ops.SILU_DWCONV_GLU.eager(x, conv_in, conv_dw)

        def cudnn_pair():  # the path past sana.ONE_PASS_DWCONV_MAX_PIXELS (the default up to session 40)
            return ops.CONV_BIAS_GLU.fused(ops.CONV_BIAS_SILU.fused(x, conv_in), conv_dw)

        def one_pass_dw():  # the path up to sana.ONE_PASS_DWCONV_MAX_PIXELS (the default from session 41)
            return kernels.dwconv_glu_rows(ops.CONV_BIAS_SILU.fused(x, conv_in), w_dw, b_dw)

        want = eager()
        row = {"kernel": "silu_dw", "shape": name, "rows": rows, "side": side,
               "eager_us": graph_timed(eager), "conv1x1_nobias_us": graph_timed(lambda: F.conv2d(x, w_in, None)),
               "today_cudnn_pair_us": graph_timed(cudnn_pair),
               "today_cudnn_pair_equal": bool(torch.equal(cudnn_pair(), want)),
               "today_one_pass_dw_us": graph_timed(one_pass_dw),
               "today_one_pass_dw_equal": bool(torch.equal(one_pass_dw(), want)),
               "default_tile": list(kernels.SILU_DW_TILE), "tiles": []}
        for tile in SILU_DW_TILES:
            def new():
                return kernels.silu_dwconv_glu(F.conv2d(x, w_in, None), b_in, w_dw, b_dw, tile)
            try:
                eq = bool(torch.equal(new(), want))
                us = graph_timed(new)
                kus = graph_timed(lambda: kernels.silu_dwconv_glu(raw, b_in, w_dw, b_dw, tile))
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile is a row too
                eq, us, kus = False, None, None
                print(f"tile {tile}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            row["tiles"].append({"tile": list(tile), "us": us, "kernel_only_us": kus, "equal": eq})
            print(json.dumps({"shape": name, **row["tiles"][-1]}), flush=True)
        ok = [t for t in row["tiles"] if t["equal"] and t["us"] is not None]
        row["best"] = min(ok, key=lambda t: t["us"]) if ok else None
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tiles"}), flush=True)
    return out


# Z-Image at 1024², batch 1: 4,096 image tokens + the caption, 3840 wide, 30 heads of 128
ROW_VAR_SHAPES = {"norm 4192x3840": (4192, 3840), "qk norm 125760x128": (4192 * 30, 128)}
ROW_VAR_TILES = {3840: [(r, w, u) for r in (1, 2, 4, 8, 16) for w in (1, 4) for u in (True, False)],
                 128: [(r, w, False) for r in (4, 16, 64) for w in (1, 4)]}


def row_var_rows() -> list[dict]:
    """kernels_rms.row_variance: every tile against aten's `x.float().pow(2).mean(-1)` (bits)
    and its time inside a CUDA graph, beside aten's two kernels it replaces."""
    from bcg.fusions import kernels_rms as K

    torch.manual_seed(0)
    out = []
    for name, (M, L) in ROW_VAR_SHAPES.items():
        x = torch.randn(M, L, device="cuda").to(torch.bfloat16)
        want = x.float().pow(2).mean(-1, keepdim=True)
        modes = [m for m in K.VAR_MODES if (m.startswith("vec") or L == 128)
                 and torch.equal(K.row_variance(x, m), want)]
        row = {"kernel": "row_var", "shape": name, "modes_equal_to_aten": modes,
               "aten_us": graph_timed(lambda: x.float().pow(2).mean(-1, keepdim=True)),
               "default_tile": list(K.VAR_TILE["vec" if L > 128 else "strided"]), "tiles": []}
        mode = modes[0] if modes else ("vec_dec" if L > 128 else "strided_dec")
        sweep(row, ROW_VAR_TILES[L], lambda tile: K.row_variance(x, mode, tile), want, graph_timed)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


ROPE_SHAPES = {"qwen_image img 1024": ("mean", 4096, 0), "qwen_image txt": ("mean", 256, 0),
               "flux img 1024": ("fused", 4096, 512)}  # norm, tokens, joint offset (Flux: text first)
ROPE_TILES = [(r, w) for r in (4, 8, 16, 32) for w in (1, 2, 4, 8)]  # kernels_rope.HEAD_ROWS, HEAD_WARPS


def rope_rows() -> list[dict]:
    """kernels_rope's q/k RMSNorm + RoPE for heads of 128 (Qwen-Image: diffusers' RMSNorm + the complex
    product; Flux: torch's RMSNorm + real pairs into the joint tensor): eager's modules, the general
    kernel (`_rope_kernel` / `_rope_fused_rms_kernel`) and _head_rows_kernel over a sweep of tiles,
    each checked equal to eager (bits) and timed inside a CUDA graph."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    from bcg.fusions import kernels_rope as KR

    torch.manual_seed(0)
    out = []
    H, D = 24, 128
    for name, (norm, S, t0) in ROPE_SHAPES.items():
        x = (torch.randn(1, S, H, D, device="cuda") * 3).to(torch.bfloat16)
        w = (1 + 0.3 * torch.randn(D, device="cuda")).to(torch.bfloat16)
        ang = torch.rand(S, D // 2, device="cuda") * 30
        joint = torch.zeros(1, S + t0, H, D, device="cuda", dtype=torch.bfloat16)
        if norm == "mean":
            mod = RMSNorm(D, eps=1e-6).to("cuda", torch.bfloat16)
            mod.weight.data.copy_(w)
            freqs = torch.polar(torch.ones_like(ang), ang)[None]

            def eager():
                return apply_rotary_emb_qwen(mod(x), freqs[0], use_real=False)

            def fused():
                return KR.rope(x, freqs, KR.Rope("complex", "fma_ac_ad"), joint, t0, norm="mean", weight=w, eps=1e-6)
        else:
            mod = torch.nn.RMSNorm(D, eps=1e-6).to("cuda", torch.bfloat16)
            mod.weight.data.copy_(w)
            cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)

            def eager():
                return apply_rotary_emb(mod(x), (cos, sin), sequence_dim=1)

            def fused():
                return KR.rope(x, (cos[None], sin[None]), KR.Rope("pairs"), joint, t0, norm="fused", weight=w,
                               eps=1e-6)
        want = eager()

        def run(tile=None):
            KR.HEAD_KERNEL = tile is not None
            if tile is not None:
                KR.HEAD_ROWS, KR.HEAD_WARPS = tile
            fused()
            return joint[:, t0:]

        saved = KR.HEAD_KERNEL, KR.HEAD_ROWS, KR.HEAD_WARPS
        try:
            general_eq = bool(torch.equal(run(), want))
            row = {"kernel": "rope", "shape": name, "norm": norm, "eager_us": graph_timed(eager),
                   "general_equal": general_eq, "general_us": graph_timed(run), "default_tile": list(saved[1:]),
                   "mbytes": round(2 * x.numel() * x.element_size() / 1e6, 1), "tiles": []}
            sweep(row, ROPE_TILES, run, want, graph_timed)
        finally:
            KR.HEAD_KERNEL, KR.HEAD_ROWS, KR.HEAD_WARPS = saved
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tiles"}), flush=True)
    return out


def _best_by(tiles: list[dict], index: int, name: str) -> str:
    """The best equal tile for each value of tile[index] (a shorter tile takes 1, the default of each of
    these): the prefetch (session 41), the FMA taps and the pipeline stages (session 58) of the row
    walks. Booleans read as 0 and 1."""
    def setting(t: dict) -> int:
        return int(t["tile"][index]) if len(t["tile"]) > index else 1

    parts = []
    ok = [t for t in tiles if t["equal"] and t["us"] is not None]
    for value in sorted({setting(t) for t in ok}, reverse=True):
        b = min((t for t in ok if setting(t) == value), key=lambda t: t["us"])
        parts.append(f"{name} {value}: {b['us']} ({b['tile']})")
    return ", ".join(parts) or "-"


def write(out_dir: Path, rows: list[dict], cmd: str, stem: str = "fusion_kernels") -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = device_tag()
    (out_dir / f"{stem}_{tag}.json").write_text(json.dumps({"env": environment(), "command": cmd,
                                                            "rows": rows}, indent=1))
    lines = [f"# {stem}_{tag}", "", f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- command: `{cmd}`", "", "| kernel | shape | equal to eager | fused us | replaces us |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r["kernel"] == "silu_dw":
            b, default = r["best"], next((t for t in r["tiles"] if t["tile"] == r["default_tile"]), None)
            lines.append(
                f"| silu_dw (CUDA graph, us a call) | {r['shape']} | "
                f"{sum(t['equal'] for t in r['tiles'])} of {len(r['tiles'])} tiles; today "
                f"{r['today_cudnn_pair_equal']}/{r['today_one_pass_dw_equal']} "
                f"| 1x1 + new: best {b['us'] if b else '-'} (tile {b['tile'] if b else '-'}, kernel "
                f"{b['kernel_only_us'] if b else '-'}), default {default['us'] if default else '-'}; "
                f"{_best_by(r['tiles'], 5, 'prefetch')}; {_best_by(r['tiles'], 6, 'FMA')} "
                f"| eager {r['eager_us']}; today {r['today_cudnn_pair_us']} (cuDNN dw) / "
                f"{r['today_one_pass_dw_us']} (one-pass dw); 1x1 alone {r['conv1x1_nobias_us']} |")
        elif r["kernel"] == "row_var":
            b, default = r["best"], next((t for t in r["tiles"] if t["tile"] == r["default_tile"]), None)
            lines.append(f"| row_var (CUDA graph, us a call; modes equal to aten: {r['modes_equal_to_aten']}) "
                         f"| {r['shape']} | {sum(t['equal'] for t in r['tiles'])} of {len(r['tiles'])} tiles "
                         f"| best {b['us'] if b else '-'} (tile {b['tile'] if b else '-'}), default "
                         f"{default['us'] if default else '-'} (tile {r['default_tile']}) "
                         f"| aten pow + mean {r['aten_us']} |")
        elif r["kernel"] == "rope":
            b, default = r["best"], next((t for t in r["tiles"] if t["tile"] == r["default_tile"]), None)
            gbs = f", {r['mbytes'] / b['us']:.2f} TB/s" if b else ""  # MB / us = TB / s
            lines.append(f"| q/k {r['norm']} RMSNorm + RoPE, heads of 128 (CUDA graph, us a call; {r['mbytes']} MB "
                         f"in + out) | {r['shape']} | {sum(t['equal'] for t in r['tiles'])} of {len(r['tiles'])} "
                         f"tiles; general kernel {r['general_equal']} | best {b['us'] if b else '-'} (rows, warps "
                         f"{b['tile'] if b else '-'}{gbs}), default {default['us'] if default else '-'} "
                         f"(tile {r['default_tile']}) | eager {r['eager_us']}; general kernel {r['general_us']} |")
        elif r["kernel"] == "ln_adaln":
            lines.append(f"| ln_adaln | {r['shape']} | {r['equal_of_3']} | {r['fused_us']} / res {r['fused_res_us']} "
                         f"| {r['aten_ln_plus_adaln_us']} / res {r['add_ln_adaln_us']} |")
        elif r["kernel"] == "dwconv_glu_rows":
            b, default = r["best"], next((t for t in r["tiles"] if t["tile"] == r["default_tile"]), None)
            lines.append(f"| dwconv_glu_rows (CUDA graph, us a call) | {r['shape']} | "
                         f"{sum(t['equal'] for t in r['tiles'])} of {len(r['tiles'])} tiles (against cuDNN + GLU) "
                         f"| best {b['us'] if b else '-'} (tile {b['tile'] if b else '-'}), default "
                         f"{default['us'] if default else '-'}; {_best_by(r['tiles'], 4, 'prefetch')}; "
                         f"{_best_by(r['tiles'], 5, 'FMA')}; {_best_by(r['tiles'], 6, 'stages')} "
                         f"| {r['cudnn_plus_glu_graph_us']} |")
        else:
            b = r["best"]
            lines.append(f"| dwconv_glu | {r['shape']} | {'all' if all(t['equal'] for t in r['tiles']) else 'some'} "
                         f"| {b['us'] if b else '-'} (tile {b['tile'] if b else '-'}) | {r['cudnn_plus_glu_us']} |")
    (out_dir / f"{stem}_{tag}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--skip", default="", help="comma list: ln, dw, dw_rows, silu_dw, row_var, rope")
    p.add_argument("--only", default="", help="comma list: run only these sections (ln, dw, dw_rows, silu_dw, "
                   "row_var, rope)")
    p.add_argument("--diagnose", action="store_true", help="only: which kernel form equals aten's LN stats")
    a = p.parse_args()
    sections = ("ln", "dw", "dw_rows", "silu_dw", "row_var", "rope")
    only = set(filter(None, a.only.split(","))) or set(sections)
    ran = [n for n in sections if n in only and n not in set(filter(None, a.skip.split(",")))]
    rows = []
    with torch.inference_mode():
        if a.diagnose:
            rows = diagnose(a.iters)
            (Path(a.out) / "ln_diagnosis.json").write_text(json.dumps(rows, indent=1))
            return
        if "ln" in ran:
            rows += ln_rows(a.iters)
        if "dw" in ran:
            rows += dw_rows(a.iters)
        if "dw_rows" in ran:
            rows += dw_walk_rows()
        if "silu_dw" in ran:
            rows += silu_dw_rows()
        if "row_var" in ran:
            rows += row_var_rows()
        if "rope" in ran:
            rows += rope_rows()
    # a partial run gets its own files (fusion_kernels_silu_dw_h200.*): it must not replace the full run's
    stem = "fusion_kernels" if len(ran) == len(sections) else "_".join(["fusion_kernels", *ran])
    write(Path(a.out), rows, "python benchmarks/bench_fusion_kernels.py " + " ".join(sys.argv[1:]), stem)


if __name__ == "__main__":
    main()
