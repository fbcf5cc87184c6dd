"""Cost of bcg.invariant (issue 30) on the GPU: each invariant kernel against today's path, and the
whole SANA-1.6B denoise loop with the batch-invariant mode on and off.

1. GEMMs: the (M, N, K) that SANA-1.6B and Flux.1-dev produce (recorded from one real diffusers
   forward of each architecture at full width, one block of each kind, batch 1; M scales with the
   batch), at 512² and 1024², batch 1..16 (SANA with CFG: 2B rows), bf16: the Triton GEMM
   (bcg.invariant.gemm_triton) against torch's (cuBLAS). Also the mode's other kernels: row mean
   (RMSNorm), per-sample convolution and the VAE decode.
2. The SANA-1.6B denoise loop (real `SanaTransformer2DModel`, published 1.6B config, random bf16
   weights normal_(0, 0.02)), 20 flow-matching Euler steps, CFG 4.5, text 300 (47 real), each
   forward one CUDA graph (as bcg replays it), mode off vs on; and whether a row's final latents are
   the same bytes at batch 1 and batch B (row 0), off and on.

    python benchmarks/bench_batch_invariant.py --out benchmarks/results        # H200: ~3-4 min
    python benchmarks/bench_batch_invariant.py --quick --out /tmp/smoke          # fewer shapes, 512² only

Rows are written after each section; the last thing printed is a short table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import SANA_1600M, TEXT_LEN, REAL_TOKENS, device_tag, environment, flow_schedule, graph_ms, write_results  # noqa: E402

from bcg.invariant import InvariantConfig, batch_invariant  # noqa: E402
from bcg.invariant.gemm_triton import matmul, tile_for  # noqa: E402
from bcg.invariant.reduce_triton import row_sum  # noqa: E402

FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=[16, 56, 56])  # FLUX.1-dev transformer/config.json, one block of each kind
COLUMNS = ["section", "model", "case", "M", "N", "K", "ms_today", "ms_invariant", "ratio", "tflops_today",
           "tflops_invariant", "rows_equal_today", "rows_equal_invariant", "note"]


def randomize(module, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, device="cuda").mul_(0.02).to(p.dtype))
            elif name.endswith("bias"):
                p.zero_()
    return module


def timed(fn, reps=20, warm=3, budget_ms=300.0) -> float:
    """Median ms of fn() over reps (CUDA events), fewer reps where one call is long."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        if out and sum(out) > budget_ms and len(out) >= 3:
            break
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


# -- 1. the GEMM shapes, recorded from the real architectures -------------------------------------

def record_gemms(fn) -> list:
    """(op, M, N, K, batch) of every GEMM and 1x1 convolution one call of fn makes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Rec(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            n = str(func)
            if n in ("aten.mm.default", "aten.addmm.default"):
                a, b = (args[0], args[1]) if n == "aten.mm.default" else (args[1], args[2])
                seen.append(("mm", a.shape[0], b.shape[1], a.shape[1], 1))
            elif n in ("aten.bmm.default", "aten.baddbmm.default"):
                a, b = (args[0], args[1]) if n == "aten.bmm.default" else (args[1], args[2])
                seen.append(("bmm", a.shape[1], b.shape[2], a.shape[2], a.shape[0]))
            elif n == "aten.convolution.default" and tuple(args[1].shape[2:]) == (1, 1):
                x, w = args[0], args[1]
                seen.append(("conv1x1", x.shape[0] * x.shape[2] * x.shape[3], w.shape[0], w.shape[1], 1))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Rec():
        fn()
    return seen


def sana_forward(model, res, batch, device="cuda"):
    side = res // 32
    x = torch.randn(2 * batch, 32, side, side, device=device).bfloat16()
    emb = torch.randn(2 * batch, TEXT_LEN, 2304, device=device).bfloat16()
    mask = torch.zeros(2 * batch, TEXT_LEN, dtype=torch.int64, device=device)
    mask[:, :REAL_TOKENS] = 1
    t = torch.full((2 * batch,), 500.0, device=device)
    return lambda: model(x, encoder_hidden_states=emb, encoder_attention_mask=mask, timestep=t, return_dict=False)[0]


def flux_forward(model, res, batch, device="cuda"):
    side = res // 16
    x = torch.randn(batch, side * side, 64, device=device).bfloat16()
    emb = torch.randn(batch, 512, 4096, device=device).bfloat16()
    pooled = torch.randn(batch, 768, device=device).bfloat16()
    ids = torch.zeros(side * side, 3, device=device)
    return lambda: model(hidden_states=x, encoder_hidden_states=emb, pooled_projections=pooled,
                         timestep=torch.full((batch,), 0.5, device=device),
                         guidance=torch.full((batch,), 3.5, device=device),
                         txt_ids=torch.zeros(512, 3, device=device), img_ids=ids, return_dict=False)[0]


def gemm_shapes(models, resolutions, batches, device="cuda") -> list:
    """Unique (model, op, M, N, K, batch) at every resolution and batch, M scaled from batch 1."""
    shapes = []
    for name, (model, fwd) in models.items():
        for res in resolutions:
            base = sorted(set(record_gemms(fwd(model, res, 1, device))))
            for b in batches:
                # recorded at batch 1 (SANA: CFG's 2 rows; Flux-dev is guidance-distilled: 1 row)
                for op, m, n, k, nb in base:
                    bmm = op == "bmm"
                    # a GEMM over tokens grows with the batch: M for mm and conv, the item count for bmm
                    shapes.append((name, res, b, op, m if bmm else m * b, n, k, nb * b if bmm else 1))
    return sorted(set(shapes))


def bench_gemms(shapes, rows_out):
    for name, res, b, op, m, n, k, nb in shapes:
        g = torch.Generator("cuda").manual_seed(0)
        if op == "bmm":
            a = torch.randn(nb, m, k, generator=g, device="cuda").bfloat16()
            w = torch.randn(nb, k, n, generator=g, device="cuda").bfloat16()
            today, inv = (lambda: torch.bmm(a, w)), (lambda: matmul(a, w))
        else:
            a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
            w = torch.randn(n, k, generator=g, device="cuda").bfloat16().t()  # a linear's weight.t()
            bias = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
            today, inv = (lambda: torch.addmm(bias, a, w)), (lambda: matmul(a, w, bias))
        t0, t1 = graph_ms(today), graph_ms(inv)
        flop = 2.0 * m * n * k * nb
        # row invariance: row 0 alone vs in the full M
        if op == "bmm":
            eq_t = torch.equal(torch.bmm(a[:1], w[:1]), torch.bmm(a, w)[:1])
            eq_i = torch.equal(matmul(a[:1], w[:1]), matmul(a, w)[:1])
        else:
            eq_t = torch.equal(torch.addmm(bias, a[:1], w), torch.addmm(bias, a, w)[:1])
            eq_i = torch.equal(matmul(a[:1], w, bias), matmul(a, w, bias)[:1])
        t = tile_for(torch.bfloat16, m, n, k, items=nb)
        rows_out.append(dict(section="gemm", model=name, case=f"{res}² B{b} {op}" + (f" x{nb}" if nb > 1 else ""),
                             M=m, N=n, K=k, ms_today=t0, ms_invariant=t1, ratio=t1 / t0,
                             tflops_today=flop / t0 / 1e9, tflops_invariant=flop / t1 / 1e9,
                             rows_equal_today=eq_t, rows_equal_invariant=eq_i,
                             note=f"tile {t.block_m}x{t.block_n}x{t.block_k}"))


def bench_other_kernels(rows_out):
    g = torch.Generator("cuda").manual_seed(0)
    for res, b in ((512, 8), (1024, 4)):
        tokens = 2 * b * (res // 32) ** 2
        x = torch.randn(tokens, 2240, generator=g, device="cuda").bfloat16()
        t0 = timed(lambda: x.float().pow(2).mean(-1, keepdim=True))
        t1 = timed(lambda: row_sum(x.float().pow(2), mean=True, keepdim=True, out_dtype=torch.float32))
        rows_out.append(dict(section="kernel", model="sana", case=f"{res}² B{b} RMS mean", M=tokens, N=1, K=2240,
                             ms_today=t0, ms_invariant=t1, ratio=t1 / t0))
        side = res // 32
        y = torch.randn(2 * b, 11200, side, side, generator=g, device="cuda").bfloat16().contiguous(
            memory_format=torch.channels_last)
        dw = torch.nn.Conv2d(11200, 11200, 3, 1, 1, groups=11200, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            t0 = timed(lambda: dw(y))
            with batch_invariant():
                t1 = timed(lambda: dw(y))
        rows_out.append(dict(section="kernel", model="sana", case=f"{res}² B{b} depthwise 3x3 per sample",
                             M=2 * b, N=11200, K=9, ms_today=t0, ms_invariant=t1, ratio=t1 / t0))


def bench_vae(rows_out, quick):
    from diffusers import AutoencoderDC

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_job_realsize import DC_AE_F32C32_SANA

    with torch.device("cuda"):
        vae = AutoencoderDC(**DC_AE_F32C32_SANA).to(torch.bfloat16).eval()
    randomize(vae)
    for res, b in ((512, 8),) if quick else ((512, 8), (1024, 4)):
        z = torch.randn(b, 32, res // 32, res // 32, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).bfloat16()
        with torch.no_grad():
            t0 = timed(lambda: vae.decode(z, return_dict=False)[0], reps=3, warm=1)
            eq0 = torch.equal(vae.decode(z[:1], return_dict=False)[0], vae.decode(z, return_dict=False)[0][:1])
            with batch_invariant():
                t1 = timed(lambda: vae.decode(z, return_dict=False)[0], reps=3, warm=1)
                eq1 = torch.equal(vae.decode(z[:1], return_dict=False)[0], vae.decode(z, return_dict=False)[0][:1])
        rows_out.append(dict(section="vae", model="dc-ae-f32c32", case=f"{res}² B{b} decode", M=b, ms_today=t0,
                             ms_invariant=t1, ratio=t1 / t0, rows_equal_today=eq0, rows_equal_invariant=eq1))
    del vae
    torch.cuda.empty_cache()


# -- 2. the SANA-1.6B denoise loop ------------------------------------------------------------------

def graphed(model, static: dict):
    """One CUDA graph of the whole forward over static inputs (warm-up first: Triton compiles there)."""
    def fwd():
        return model(static["x"], encoder_hidden_states=static["emb"], encoder_attention_mask=static["mask"],
                     timestep=static["t"], return_dict=False)[0]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fwd()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fwd()
    return graph, out


def top_kernels(graph, top=12) -> dict:
    """One replay under the profiler: GPU ms by kind of kernel and the heaviest kernels by name."""
    from collections import Counter

    from kernel_kinds import kind_of
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kinds, names = Counter(), Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kinds[kind_of(e.name)] += e.device_time_total / 1e3
            names[e.name[:90]] += e.device_time_total / 1e3
    return {"kinds_ms": {k: round(v, 2) for k, v in kinds.most_common()},
            "top_ms": {k: round(v, 3) for k, v in names.most_common(top)}}


def denoise(model, res, batch, invariant: bool, reps: int, profile: bool = False):
    side = res // 32

    def per_row(seed, *shape):  # each row from its own generator: row 0 is the same at any batch
        return torch.randn(*shape, generator=torch.Generator("cuda").manual_seed(seed), device="cuda")

    lat0 = torch.cat([per_row(100 + i, 1, 32, side, side) for i in range(batch)])
    emb = torch.cat([per_row(200 + i, 1, TEXT_LEN, 2304) for i in range(batch)]  # negatives, then positives
                    + [per_row(300 + i, 1, TEXT_LEN, 2304) for i in range(batch)]).bfloat16()
    mask = torch.zeros(2 * batch, TEXT_LEN, dtype=torch.int64, device="cuda")
    mask[:, :REAL_TOKENS] = 1
    timesteps, sigmas = flow_schedule(20, device="cuda")
    static = dict(x=torch.empty(2 * batch, 32, side, side, device="cuda", dtype=torch.bfloat16), emb=emb,
                  mask=mask, t=torch.empty(2 * batch, device="cuda"))
    mode = batch_invariant(InvariantConfig()) if invariant else None
    if mode:
        mode.install()
    try:
        static["x"].copy_(torch.cat([lat0, lat0]).bfloat16())
        static["t"].fill_(float(timesteps[0]))
        t_cap = time.perf_counter()
        graph, out = graphed(model, static)
        t_cap = time.perf_counter() - t_cap
    finally:
        if mode:
            mode.remove()  # the graph keeps the kernels it recorded

    def loop():
        lat = lat0.clone()
        for i, t in enumerate(timesteps):
            static["x"].copy_(torch.cat([lat, lat]))
            static["t"].fill_(t)
            graph.replay()
            neg, pos = out.float().chunk(2)
            v = neg + 4.5 * (pos - neg)
            lat = lat + (sigmas[i + 1] - sigmas[i]) * v
        return lat

    ms = timed(loop, reps=reps, warm=1)
    final = loop()
    if profile:
        print(f"PROFILE {res}² B{batch} invariant={invariant} one forward: {top_kernels(graph)}", flush=True)
    del graph
    return ms, final, t_cap


def bench_denoise(rows_out, quick, profile=False):
    from diffusers import SanaTransformer2DModel

    with torch.device("cuda"):
        model = SanaTransformer2DModel(**SANA_1600M).to(torch.bfloat16).eval().requires_grad_(False)
    randomize(model)
    cases = [(512, 1), (512, 8)] if quick else [(512, 1), (512, 8), (1024, 1), (1024, 4)]
    with torch.no_grad():
        for res, b in cases:
            ms_off, lat_off, _ = denoise(model, res, b, False, reps=3, profile=profile)
            ms_on, lat_on, cap = denoise(model, res, b, True, reps=3, profile=profile)
            row = dict(section="denoise", model="sana-1.6b", case=f"{res}² B{b} 20 steps CFG graph", M=b,
                       ms_today=ms_off, ms_invariant=ms_on, ratio=ms_on / ms_off, note=f"capture {cap:.1f} s")
            if b > 1:  # row 0 at batch 1 against row 0 in this batch (same seeds: lat0 row 0 is the same)
                _, one_off, _ = denoise(model, res, 1, False, reps=1)
                _, one_on, _ = denoise(model, res, 1, True, reps=1)
                row.update(rows_equal_today=torch.equal(one_off, lat_off[:1]),
                           rows_equal_invariant=torch.equal(one_on, lat_on[:1]))
            rows_out.append(row)
            print(row, flush=True)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", action="store_true", help="only list the GEMM shapes (meta tensors, no GPU)")
    ap.add_argument("--profile", action="store_true", help="print each denoise graph's kernel mix (one forward)")
    a = ap.parse_args()
    if a.shapes:
        return list_shapes()
    assert torch.cuda.is_available(), "bench_batch_invariant needs CUDA"
    t0 = time.time()
    rows: list = []
    meta = environment()
    stem = f"batch_invariant_{device_tag()}" + ("_quick" if a.quick else "")

    def save(notes=()):
        write_results(a.out, stem, rows, COLUMNS, list(notes), meta)

    from diffusers import FluxTransformer2DModel, SanaTransformer2DModel

    with torch.device("cuda"):
        sana1 = SanaTransformer2DModel(**{**SANA_1600M, "num_layers": 1}).to(torch.bfloat16).eval()
        flux1 = FluxTransformer2DModel(**FLUX_DEV).to(torch.bfloat16).eval()
    res = (512,) if a.quick else (512, 1024)
    batches = (1, 8) if a.quick else (1, 2, 4, 8, 16)
    shapes = gemm_shapes({"sana": (sana1, sana_forward), "flux": (flux1, flux_forward)}, res, batches)
    del sana1, flux1
    torch.cuda.empty_cache()
    print(f"{len(shapes)} GEMM shapes", flush=True)
    # A section that fails is a row saying so; the others still run (one device call, no retry).
    for section, fn in (("gemm", lambda: bench_gemms(shapes, rows)), ("kernel", lambda: bench_other_kernels(rows)),
                        ("vae", lambda: bench_vae(rows, a.quick)), ("denoise", lambda: bench_denoise(rows, a.quick, a.profile))):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            rows.append(dict(section=section, model="—", case="failed", note=f"{type(exc).__name__}: {exc}"[:300],
                             ms_today=float("nan"), ms_invariant=float("nan"), ratio=float("nan")))
        torch.cuda.empty_cache()
        save()
    notes = [f"wall {time.time() - t0:.0f} s",
             "ratio = invariant / today (lower is better); today = torch's own kernels (cuBLAS, cuDNN, aten)",
             "rows_equal: row 0 alone == row 0 of the batch, bitwise"]
    save(notes)
    print(f"\n{stem} ({time.time() - t0:.0f} s)")
    summary(rows)


def list_shapes() -> None:
    """The (M, N, K) table of the GEMMs, recorded on meta tensors (no weights, no GPU)."""
    from diffusers import FluxTransformer2DModel, SanaTransformer2DModel

    with torch.device("meta"):
        sana1 = SanaTransformer2DModel(**{**SANA_1600M, "num_layers": 1}).to(torch.bfloat16)
        flux1 = FluxTransformer2DModel(**FLUX_DEV).to(torch.bfloat16)
    for name, model, fwd in (("sana", sana1, sana_forward), ("flux", flux1, flux_forward)):
        for res in (512, 1024):
            base = sorted(set(record_gemms(fwd(model, res, 1, "meta"))))
            print(f"{name} {res}² batch 1 (M grows with B: x B; bmm items x B):")
            for op, m, n, k, nb in base:
                print(f"  {op:8} M={m:<6} N={n:<6} K={k:<6}" + (f" items={nb}" if nb > 1 else ""))


def summary(rows) -> None:
    """The short table: time-weighted GEMM ratio per model and resolution, then the other rows."""
    agg: dict = {}
    for r in rows:
        if r["section"] == "gemm":
            key = (r["model"], r["case"].split()[0])
            t, i = agg.get(key, (0.0, 0.0))
            agg[key] = (t + r["ms_today"], i + r["ms_invariant"])
    print(f"{'what':44} {'today ms':>10} {'invariant ms':>12} {'ratio':>6}  rows equal (today/inv)")
    for (m, res), (t, i) in sorted(agg.items()):
        bad = sum(1 for r in rows if r["section"] == "gemm" and r["model"] == m and r["case"].startswith(res)
                  and not r.get("rows_equal_invariant", False))
        print(f"{'GEMMs ' + m + ' ' + res + ' (sum, all B)':44} {t:10.2f} {i:12.2f} {i / t:6.2f}  inv. failures {bad}")
    for r in rows:
        if r["section"] != "gemm":
            eq = f"{r.get('rows_equal_today', '—')}/{r.get('rows_equal_invariant', '—')}"
            print(f"{r['model'] + ' ' + r['case']:44} {r['ms_today']:10.2f} {r['ms_invariant']:12.2f} "
                  f"{r['ratio']:6.2f}  {eq}")


if __name__ == "__main__":
    main()
