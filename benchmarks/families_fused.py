"""`bench_families.py --table fused`: per family, shape, batch and mode, the denoise loop at real size,
with the lossless fused forward beside eager, bcg and torch.compile(mode="reduce-overhead").

    modes        eager        the model's own forward
                 bcg          the whole forward as one CUDA graph (break_policy none, fusions off)
                 bcg-fused    the same graph of the lossless fused forward (fusions "lossless"; every
                              chain and block verified against eager on first sight, the verdict cache off)
                 compile-ro   torch.compile(mode="reduce-overhead") of the whole model (--compile full), or
                              of each repeated block (--compile regional: diffusers' compile_repeated_blocks,
                              minutes less compile time for 30-60 layer models)
    batches      1 and the batch a long sorted job cuts (the graph pool's largest: 8 for the image
                 families at 1024², 2 for the video families at 480x832x49), each item the same
                 prompt: the work of that batch, compared bit for bit at that batch
    weights      each released checkpoint's transformer config, random bf16 weights: every matrix and
                 kernel normal_(0, 0.02), vectors (norm weights, biases) as diffusers initialises them

Each row: family, shape, batch, mode, denoise_ms (median of --loops loops, and min, max), steps,
kernels_per_step and GPU ms a step by kind of kernel (profiler, one step; benchmarks/profile_fusions.py's
kinds: GEMM, attention, bcg's Triton kernels, Inductor's, aten elementwise, norms, copies ...),
bitwise_equal_to_eager and rel_err_vs_eager (final latents, against eager at the same batch), and
for the graph modes their capture and verification counters. Rows are written after each family.

    python benchmarks/bench_families.py --table fused --quick --families flux,qwen_image,wan --out $OUT
"""

from __future__ import annotations

import gc
import logging
import os
import time
import traceback

import torch

import families_image as image
import families_video as video
from common import LoopTimer, device_tag, environment, flow_schedule, sync, write_results
from kernel_kinds import kind_of

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import install_fusions

JOB_BATCH = {"image": 8, "video": 2}
MODES = ("eager", "bcg", "bcg-fused", "compile-ro")
COLUMNS = ["family", "shape", "batch", "mode", "steps", "denoise_ms", "denoise_ms_min", "denoise_ms_max",
           "vs_eager", "vs_bcg", "vs_compile_ro", "kernels_per_step", "gpu_ms_per_step", "bitwise_equal_to_eager",
           "rel_err_vs_eager", "first_loop_s", "skipped"]
KIND_ORDER = ("gemm", "attention", "convolution", "triton (bcg)", "triton (inductor)", "aten elementwise",
              "aten norm", "aten reduction", "copy", "other")


def init_normal(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights of a trained model's scale: every matrix / kernel normal_(0, 0.02), vectors kept."""
    g = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).mul_(0.02))


def batched(fwd, batch: int):
    """`fwd` on `batch` copies of each call's items (tensors and per-item lists along dim 0), returning
    the first copy's outputs: the loop around it stays the batch-1 loop, the GPU does the batch's work."""
    if batch == 1:
        return fwd

    def tile(v, n: int):
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n:
            return torch.cat([v] * batch)
        if isinstance(v, list) and len(v) == n:
            return v * batch
        return v

    def first(v, n: int):
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n * batch:
            return v[:n]
        if isinstance(v, list) and len(v) == n * batch:  # Z-Image: one output tensor an item
            return v[:n]
        if isinstance(v, (tuple, list)):
            return type(v)(first(x, n) for x in v)
        return v

    def call(*args, **kw):
        x = kw.get("hidden_states", kw.get("x", args[0] if args else None))
        n = len(x) if isinstance(x, list) else x.shape[0]
        out = fwd(*(tile(a, n) for a in args), **{k: tile(v, n) for k, v in kw.items()})
        return first(out, n)

    return call


def _setup(family: str, args, device: str, dtype: torch.dtype):
    """(model, lat0, step, shape, calls a step, kind) at the family's real config (--tiny: its tiny preset's)."""
    if family in video.REAL:
        config = image.tiny_configs()[family] if args.tiny else video.REAL[family]
        model = video.build(family, config, device, dtype)
        if args.init == "normal":
            init_normal(model)
        lat0, step, info = video.make_step(family, model, args.tiny, device, dtype)
        return model, lat0, step, info["resolution"], info["calls_per_step"], "video"
    config = image.tiny_configs()[family] if args.tiny else image.REAL[family]
    resolution = 64 if args.tiny else args.resolution
    model = image.build(family, config, device, dtype)
    if args.init == "normal":
        init_normal(model)
    lat0, step = image.make_step(family, config, resolution // 8, device, dtype, args.tiny)
    return model, lat0, step, f"{resolution}x{resolution}", 2 if family in image.CFG_SCALE else 1, "image"


def _profile(step_once) -> dict:
    """One step under the profiler: kernels and GPU ms, by kind."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step_once()
        sync()
    kinds: dict[str, list] = {}
    names: dict[str, float] = {}
    n = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kinds.setdefault(kind_of(e.name), [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total / 1e3
            names[e.name[:100]] = names.get(e.name[:100], 0.0) + e.device_time_total / 1e3
            n += 1
    top = sorted(names.items(), key=lambda kv: -kv[1])[:15]  # where the next fusion's time is
    return {"kernels_per_step": n, "gpu_ms_per_step": round(sum(v[1] for v in kinds.values()), 2),
            "top_kernels_ms": {k: round(v, 3) for k, v in top},
            "kinds_ms": {k: round(kinds[k][1], 3) for k in KIND_ORDER if k in kinds},
            "kinds_calls": {k: kinds[k][0] for k in KIND_ORDER if k in kinds}}


def run_family(family: str, args, device: str, dtype: torch.dtype) -> list[dict]:
    model, lat0, step1, shape, calls, kind = _setup(family, args, device, dtype)
    timesteps, sigmas = flow_schedule(args.steps, shift=3.0, device=device)
    batches = [1 if b == "1" else (JOB_BATCH[kind] if b == "job" else int(b)) for b in args.batches.split(",")]
    rows = []
    for batch in dict.fromkeys(batches):
        def loop(fwd):
            f = batched(fwd, batch)
            lat = lat0.clone()
            for i, t in enumerate(timesteps):
                lat = lat + (sigmas[i + 1] - sigmas[i]) * step1(f, lat, t)
            return lat

        def timed(fwd) -> tuple[list[float], torch.Tensor]:
            times, out = [], None
            for _ in range(args.loops):
                with LoopTimer() as t:
                    out = loop(fwd)
                times.append(t.ms)
            return sorted(times), out

        ref = None
        base = {"family": family, "shape": shape, "batch": batch, "steps": args.steps, "calls_per_step": calls}
        for mode in args.modes.split(","):
            row = dict(base, mode=mode)
            try:
                with torch.no_grad():
                    row.update(_run_mode(mode, model, loop, timed, lambda fwd: step1(batched(fwd, batch), lat0,
                                                                                     timesteps[0]), args))
                out = row.pop("_latents")
                if mode == "eager":
                    ref = out
                elif ref is not None:
                    row["bitwise_equal_to_eager"] = bool(torch.equal(out, ref))
                    row["rel_err_vs_eager"] = float((out - ref).norm() / ref.norm())
                    row["max_abs_diff"] = float((out - ref).abs().max())
                del out
            except Exception as e:  # keep the other rows; say what failed
                traceback.print_exc()
                row["skipped"] = f"{type(e).__name__}: {str(e)[:160]}"
            finally:
                if mode == "compile-ro":
                    torch._dynamo.reset()
                gc.collect()
                torch.cuda.empty_cache()
            logging.info("%s", row)
            rows.append(row)
        _ratios([r for r in rows if r["batch"] == batch])
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def _step_marked(compiled):
    """A reduce-overhead model called as a user must call it when outputs outlive the next call (CFG's
    two calls a step, the loop's latents): each call marks a new step and clones what it returns, or
    the next replay overwrites the last one's outputs in the graph's pool (torch.compiler docs,
    "accessing tensor output of CUDAGraphs that has been overwritten")."""
    def call(*args, **kw):
        torch.compiler.cudagraph_mark_step_begin()
        return _clone(compiled(*args, **kw))

    return call


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (tuple, list)):
        return type(v)(_clone(x) for x in v)
    return v


def _run_mode(mode: str, model, loop, timed, step_once, args) -> dict:
    out: dict = {}
    if mode == "eager":
        step_once(model)  # warm-up: kernels, workspaces, RoPE caches
        times, lat = timed(model)
        prof = _profile(lambda: step_once(model))
    elif mode in ("bcg", "bcg-fused"):
        cuda = torch.cuda.is_available()
        # CPU smoke run (--tiny): bcg's op tape, and the fusions' plain-torch plans installed by hand
        # (the runner installs the Triton ones on its CUDA backend only)
        fx = install_fusions(model, backend="reference") if mode == "bcg-fused" and not cuda else None
        runner = apply_graph_runner(model, RunnerConfig(backend="cuda" if cuda else "tape", 
                                                        fusions="lossless" if mode == "bcg-fused" and cuda else "off"), break_policy="none")
        runner.capture_allowed = True
        try:
            t0 = time.perf_counter()
            loop(model)  # eager warm-ups (fusions: first-sight verification), capture, then replays
            sync()
            out["first_loop_s"] = round(time.perf_counter() - t0, 2)
            times, lat = timed(model)
            prof = _profile(lambda: step_once(model))
            stats = runner.stats()
            if fx is not None:
                stats["fusions"] = fx.stats()
        finally:
            runner.remove()
            if fx is not None:
                fx.remove()
        out.update(graphs=stats["captures"], segments=stats["segments"], misses=stats["misses"],
                   capture_failures=stats["capture_failures"])
        if mode == "bcg-fused":
            fx = stats.get("fusions", {})
            out.update({f"fusions_{k}": fx.get(k) for k in ("modules", "verified", "rejected", "forwards_verified",
                                                            "forwards_rejected", "fused_calls", "not_applicable")})
            out["fusions_rejections"] = fx.get("rejections")
    elif mode == "compile-ro":
        if not torch.cuda.is_available():
            raise RuntimeError("compile-ro needs CUDA (reduce-overhead records CUDA graphs)")
        regional = args.compile == "regional" and bool(getattr(model, "_repeated_blocks", None))
        if regional:  # each repeated block class compiled once, its instances sharing the code
            model.compile_repeated_blocks(mode="reduce-overhead", dynamic=False)
            fwd = model
        else:
            fwd = _step_marked(torch.compile(model, mode="reduce-overhead", dynamic=False))
        try:
            t0 = time.perf_counter()
            loop(fwd)  # compile, and reduce-overhead's own warm-up runs and graph recording
            sync()
            out["first_loop_s"] = round(time.perf_counter() - t0, 2)
            times, lat = timed(fwd)
            prof = _profile(lambda: step_once(fwd))
        finally:
            if regional:  # the plain blocks again for the next batch's eager row
                for m in model.modules():
                    if type(m).__name__ in model._repeated_blocks:
                        m._compiled_call_impl = None
        out["compile_scope"] = "regional" if regional else "full"
    else:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    out.update(denoise_ms=round(times[len(times) // 2], 1), denoise_ms_min=round(times[0], 1),
               denoise_ms_max=round(times[-1], 1), loops=len(times), _latents=lat, **prof)
    return out


def _ratios(rows: list[dict]) -> None:
    by = {r["mode"]: r.get("denoise_ms") for r in rows}
    for r in rows:
        ms = r.get("denoise_ms")
        if not ms:
            continue
        for key, mode in (("vs_eager", "eager"), ("vs_bcg", "bcg"), ("vs_compile_ro", "compile-ro")):
            if by.get(mode) and mode != r["mode"]:
                r[key] = round(by[mode] / ms, 3)  # > 1: this mode is that much faster


def run_all(args) -> None:
    """Every family of --families: rows to <out>/<stem>_<gpu>.json / .md after each."""
    os.environ.setdefault("BCGEN_FUSION_CACHE", "off")  # every run verifies on first sight (rows count it)
    if args.quick:
        args.steps, args.loops, args.batches = 2, 3, "1"
        args.compile = args.compile or "regional"
    args.compile = args.compile or "full"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    meta = environment()
    stem = f"{args.stem if args.stem != 'families' else 'families_fused'}_{device_tag()}" + ("_tiny" if args.tiny else "")
    rows: list[dict] = []
    for family in args.families.split(","):
        try:
            rows += run_family(family, args, device, dtype)
        except Exception as e:  # noqa: BLE001 - keep the other families
            traceback.print_exc()
            rows.append({"family": family, "skipped": f"{type(e).__name__}: {str(e)[:160]}"})
        write_results(args.out, stem, rows, COLUMNS, _notes(args), meta)
        _write_kinds(args.out, stem, rows)


def _notes(args) -> list[str]:
    return [f"Denoise loop of {args.steps} flow-matching Euler steps, median (min, max) of {args.loops} loops "
            "(CUDA events); graph modes after one untimed loop (warm-ups, first-sight verification, capture), "
            f"compile-ro after one untimed loop (compile, --compile {args.compile}).",
            f"Random bf16 weights ({args.init}: matrices normal_(0, 0.02)) with each released checkpoint's "
            "transformer config; text of the encoder's width and the family's length; no text encoder, no VAE.",
            "vs_*: that mode's denoise_ms / this row's (> 1: this row is faster). bitwise_equal_to_eager and "
            "rel_err_vs_eager: final latents against the eager row of the same batch.",
            "kernels_per_step, gpu_ms_per_step: one profiled step (graph modes replaying); the kernel-time mix "
            "by kind is in <stem>_kinds.md and in each JSON row (kinds_ms, kinds_calls).",
            "batch > 1: each item the same prompt, the GPU doing the batch's work (families_fused.batched)."]


def _write_kinds(out_dir: str, stem: str, rows: list[dict]) -> None:
    lines = [f"# {stem}: GPU ms a step by kind of kernel (one profiled step)", "",
             "| family | batch | mode | " + " | ".join(KIND_ORDER) + " | total | kernels |",
             "|" + "---|" * (len(KIND_ORDER) + 5)]
    for r in rows:
        if "kinds_ms" in r:
            k = r["kinds_ms"]
            lines.append(f"| {r['family']} | {r['batch']} | {r['mode']} | "
                         + " | ".join(f"{k.get(n, 0):.2f}" for n in KIND_ORDER)
                         + f" | {r['gpu_ms_per_step']} | {r['kernels_per_step']} |")
    from pathlib import Path

    Path(out_dir, f"{stem}_kinds.md").write_text("\n".join(lines) + "\n")
