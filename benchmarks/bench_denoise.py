"""Denoise-loop benchmark: eager vs bcg vs torch.compile on the SANA-1.6B architecture (H200).

Random bf16 weights, text length 300 with 47 real tokens, classifier-free guidance (2B rows per
forward), 20 flow-matching Euler steps (diffusers FlowMatchEulerDiscreteScheduler's sigmas, plain
Euler update), denoise loop only (no text encoder, no VAE). Per mode: median/min/max loop time
(CUDA events), GPU kernel time of one profiled loop, GPU busy fraction, host launches per step,
peak memory, capture/compile seconds, relative error of the final latents against eager.

    python benchmarks/bench_denoise.py --out benchmarks/results            # full
    python benchmarks/bench_denoise.py --quick --out /tmp/smoke            # 512^2 B1, no compile
    python benchmarks/bench_denoise.py --configs 1024x1 --modes eager,bcg-fused --out benchmarks/results \
        --compile 1024x1:compile-ro,1024x1:compile-ro-memo,1024x1:compile-max-autotune --tag memo

Compile rows (`--compile`): compile, compile-ro (reduce-overhead), compile-max-autotune, and their
`-memo` forms: given the prompt memo bcgen has (caption projection, caption norm and every block's
cross-attention K/V made once a loop, outside the compiled region: benchmarks/sana_prompt_memo.py),
so bcg-fused is set against a compiled model doing the same work a step.

Rows are written after each measurement, so a run cut short keeps what it measured; modes that
do not fit the time budget are written as skipped rows with the reason.
"""

from __future__ import annotations

import argparse
import math
import logging
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (TINY, LoopTimer, build_sana, denoise_inputs, device_tag, environment,  # noqa: E402
                    flow_schedule, kernel_profile, sync, write_results)

from bcg import RunnerConfig, apply_graph_runner  # noqa: E402
from bcg.fusions import install_fusions  # noqa: E402

GUIDANCE = 4.5
COLUMNS = ["mode", "resolution", "batch", "denoise_ms", "denoise_min_ms", "denoise_max_ms",
           "speedup_vs_eager", "gpu_kernel_ms", "gpu_busy", "kernels_per_step", "host_launches_per_step",
           "peak_mem_gib", "setup_s", "segments", "rel_err_vs_eager", "psnr_vs_lossless_db", "skipped"]


def make_loop(forward, inp: dict, timesteps, sigmas, mark_step: bool = False, begin=None):
    """`begin`: a prompt memo's (sana_prompt_memo.py), called with the prompt embeddings once a
    loop, whose forward then takes no prompt embeddings."""
    emb, mask = inp["encoder_hidden_states"], inp["encoder_attention_mask"]
    dtype = emb.dtype
    prompt = {} if begin is not None else {"encoder_hidden_states": emb}

    def loop() -> torch.Tensor:
        lat = inp["latents"]
        if begin is not None:
            begin(emb)  # once per prompt batch, as bcgen's memo
        for i, t in enumerate(timesteps):
            x = torch.cat([lat, lat]).to(dtype)
            timestep = t.expand(x.shape[0]).to(dtype)  # as SanaPipeline builds it
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            v = forward(hidden_states=x, **prompt, encoder_attention_mask=mask,
                        timestep=timestep, return_dict=False)[0].float()
            uncond, cond = v.chunk(2)
            lat = lat + (sigmas[i + 1] - sigmas[i]) * (uncond + GUIDANCE * (cond - uncond))
        return lat

    return loop


def time_loops(loop, n: int) -> tuple[list[float], torch.Tensor]:
    times, out = [], None
    for _ in range(n):
        with LoopTimer() as t:
            out = loop()
        times.append(t.ms)
    return times, out


COMPILE_MODES = {  # bench mode -> (torch.compile mode, prompt memo)
    "compile": (None, False),
    "compile-ro": ("reduce-overhead", False),
    # reduce-overhead given bcgen's prompt memo: caption path and K/V once a loop, outside the compiled region
    "compile-ro-memo": ("reduce-overhead", True),
    "compile-max-autotune": ("max-autotune", False),  # autotuned GEMM/conv templates + CUDA graphs
    "compile-max-autotune-memo": ("max-autotune", True),
}


def setup_mode(mode: str, model):
    """(forward callable, teardown, runner or None, mark_step, begin or None)."""
    if mode == "eager":
        return model, lambda: None, None, False, None
    if mode == "bcg-compile":  # the compiled forward captured as one graph (bcg/compiled.py)
        backend = "cuda" if torch.cuda.is_available() else "tape"
        torch._dynamo.reset()
        runner = apply_graph_runner(model, RunnerConfig(backend=backend, compile=True))

        def teardown():
            runner.remove()
            torch._dynamo.reset()

        return model, teardown, runner, False, None
    if mode == "bcg-fused-noprompt":  # the fused blocks alone: K/V made every step (no sana_prompt)
        runner = apply_graph_runner(model, RunnerConfig(backend="cuda", fusions="lossless"), break_policy="none")
        runner.fusions.remove()
        runner.fusions = install_fusions(model, rules=["sana_block"])
        return model, runner.remove, runner, False, None
    if mode.startswith("bcg-fused"):  # graphs of the lossless fused forward (bcg/fusions), prompt memo included
        backend = "cuda" if torch.cuda.is_available() else "tape"
        policy = mode[len("bcg-fused-"):] if mode.startswith("bcg-fused-") else "none"
        runner = apply_graph_runner(model, RunnerConfig(backend=backend, fusions="lossless"), break_policy=policy)
        return model, runner.remove, runner, False, None
    if mode.startswith("bcg-"):  # graphs of the model's own kernels (fusions off: the baseline)
        backend = "cuda" if torch.cuda.is_available() else "tape"  # tape: --device cpu smoke runs
        runner = apply_graph_runner(model, RunnerConfig(backend=backend, fusions="off"), break_policy=mode[4:])
        return model, runner.remove, runner, False, None
    compile_mode, memo = COMPILE_MODES[mode]
    torch._dynamo.reset()
    target, begin = model, None
    if memo:
        from sana_prompt_memo import PromptMemoForward

        target = PromptMemoForward(model)
        begin = target.begin
    compiled = torch.compile(target, mode=compile_mode)
    # reduce-overhead and max-autotune both record CUDA graphs (cudagraph trees): one step a replay
    return compiled, torch._dynamo.reset, None, compile_mode is not None, begin


def measure(mode: str, model, res: int, batch: int, loops: int, ref: torch.Tensor | None,
            steps: int) -> tuple[dict, torch.Tensor]:
    device = next(model.parameters()).device
    inp = denoise_inputs(res, batch, device=device)
    timesteps, sigmas = flow_schedule(steps, device=device)
    sync()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    forward, teardown, runner, mark, begin = setup_mode(mode, model)
    try:
        loop = make_loop(forward, inp, timesteps, sigmas, mark, begin)
        t0 = time.perf_counter()
        with torch.no_grad():
            loop()  # captures (bcg) / compiles (torch.compile) on its first step
            sync()
            setup_s = time.perf_counter() - t0
            if mark:
                loop()  # cudagraph trees record after a warm-up call
            times, out = time_loops(loop, loops)
            prof = kernel_profile(loop, steps)
        stats = runner.stats() if runner is not None else {}
    finally:
        teardown()
    med = statistics.median(times)
    row = {
        "mode": mode, "resolution": res, "batch": batch, "steps": steps, "loops": loops,
        "denoise_ms": round(med, 2), "denoise_min_ms": round(min(times), 2),
        "denoise_max_ms": round(max(times), 2), "denoise_all_ms": [round(t, 2) for t in times],
        **prof,
        "gpu_busy": round(prof["gpu_kernel_ms"] / med, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        "setup_s": round(setup_s, 2),
    }
    if runner is not None:
        row.update(segments=stats["entries"][0]["segments"] if stats["entries"] else None,
                   capture_s_per_signature=round(stats["capture_seconds"] / max(1, stats["captures"]), 3),
                   captures=stats["captures"], hits=stats["hits"], misses=stats["misses"],
                   graph_mib=round(stats["peak_graph_bytes"] / 2**20, 1))
        fx = stats.get("fusions", {})
        if "verified" in fx:
            row.update(fusions_verified=fx["verified"], fusions_rejected=fx["rejected"],
                       fusion_rejections=fx["rejections"])
        row.update(memo_runs=stats["memo_runs"], memo_reuses=stats["memo_reuses"])
    if COMPILE_MODES.get(mode, (None, False))[1]:
        from sana_prompt_memo import check

        step = {"hidden_states": torch.cat([inp["latents"]] * 2).to(inp["encoder_hidden_states"].dtype),
                "encoder_hidden_states": inp["encoder_hidden_states"],
                "encoder_attention_mask": inp["encoder_attention_mask"],
                "timestep": timesteps[0].expand(2 * batch).to(inp["encoder_hidden_states"].dtype)}
        row["memo_forward_equals_model_eager"] = check(model, step)  # the baseline computes the model's function
    if ref is not None:
        row["rel_err_vs_eager"] = float((out - ref).norm() / ref.norm())
        row["max_abs_err_vs_eager"] = float((out - ref).abs().max())
        row["bitwise_equal_to_eager"] = bool(torch.equal(out, ref))
        row["psnr_vs_lossless_db"] = psnr(out, ref)
    return row, out


def psnr(out: torch.Tensor, ref: torch.Tensor) -> float | None:
    """PSNR of the final latents against eager's (= the lossless tier's bits), over eager's value
    range; None where they are equal bit for bit (infinite)."""
    mse = float((out.float() - ref.float()).pow(2).mean())
    if mse == 0.0:
        return None
    peak = float(ref.float().max() - ref.float().min())
    return round(10 * math.log10(peak * peak / mse), 2)


def targets(rows: list[dict]) -> list[str]:
    def get(mode, res, b):
        return next((r for r in rows if r["mode"] == mode and r["resolution"] == res
                     and r["batch"] == b and "denoise_ms" in r), None)

    notes = []
    e, n, a = get("eager", 512, 1), get("bcg-none", 512, 1), get("bcg-attention", 512, 1)
    if e and n:
        notes.append(
            f"512² B1: bcg(none) {e['denoise_ms'] / n['denoise_ms']:.2f}x eager by medians "
            f"(eager {e['denoise_ms']} [{e['denoise_min_ms']}–{e['denoise_max_ms']}] ms, bcg(none) "
            f"{n['denoise_ms']} [{n['denoise_min_ms']}–{n['denoise_max_ms']}] ms; worst case "
            f"eager min / bcg max = {e['denoise_min_ms'] / n['denoise_max_ms']:.2f}x); target >= 3.0x")
        if n["gpu_kernel_ms"]:
            notes.append(f"512² B1: bcg(none) is {100 * (n['denoise_ms'] / n['gpu_kernel_ms'] - 1):+.1f}% "
                         f"over its own GPU kernel time ({n['gpu_kernel_ms']} ms); target within 3%")
    if n and a:
        notes.append(f"512² B1: bcg(attention) is {100 * (a['denoise_ms'] / n['denoise_ms'] - 1):+.1f}% "
                     f"vs bcg(none) ({a.get('segments')} segments); target within 5%")
    e, n = get("eager", 1024, 1), get("bcg-none", 1024, 1)
    if e and n:
        notes.append(f"1024² B1: bcg(none) is {100 * (1 - n['denoise_ms'] / e['denoise_ms']):.1f}% faster "
                     "than eager; target >= 8%")
    for res, b, bar in ((1024, 1, 1.0), (512, 1, 1.05)):
        f = get("bcg-fused", res, b)
        for base in ("compile-ro", "compile-ro-memo", "compile-max-autotune", "compile-max-autotune-memo"):
            c = get(base, res, b)
            if f and c:
                notes.append(f"{res}² B{b}: bcg-fused {f['denoise_ms']} ms = {f['denoise_ms'] / c['denoise_ms']:.3f}x "
                             f"{base} ({c['denoise_ms']} ms)" + (f"; target <= {bar}x" if base == "compile-ro" else ""))
    fused = [r for r in rows if r["mode"] == "bcg-fused" and "rel_err_vs_eager" in r]
    if fused:
        notes.append("bcg-fused rel_err_vs_eager: " + ", ".join(
            f"{r['resolution']}² B{r['batch']} {r['rel_err_vs_eager']:g}" for r in fused) + "; target 0.0 in every row")
    caps = [r["capture_s_per_signature"] for r in rows if "capture_s_per_signature" in r]
    if caps:
        notes.append(f"capture (2 warm-up forwards + capture) per signature: {min(caps):.2f}–{max(caps):.2f} s; "
                     "target <= 3 s")
    notes.append("gpu_kernel_ms: kernels + memcpy/memset of one profiled loop; gpu_busy = gpu_kernel_ms / "
                 "median denoise_ms; host launches = cudaLaunchKernel* + cudaGraphLaunch per step")
    return notes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 1-layer model: smoke-test the script")
    p.add_argument("--quick", action="store_true", help="512^2 B1, 2 loops, no torch.compile")
    p.add_argument("--loops", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--configs", default="512x1,1024x1,512x4,1024x4")
    p.add_argument("--modes", default="eager,bcg-none,bcg-attention,bcg-fused",
                   help="modes run at every config (bcg-compile: the compiled forward as a graph; "
                        "bcg-fused: graphs of the lossless fused forward, bcg/fusions, prompt memo included; "
                        "bcg-fused-noprompt: the same without sana_prompt, K/V made every step)")
    p.add_argument("--tag", default="", help="suffix of the result file names")
    p.add_argument("--budget-s", type=float, default=420, help="wall budget for the whole run")
    p.add_argument("--compile-row-s", type=float, default=110,
                   help="time a torch.compile row needs (compile + loops); skipped if not left")
    p.add_argument("--max-autotune-row-s", type=float, default=420,
                   help="the same for a max-autotune row (its GEMM/conv autotuning takes minutes at 1.6B)")
    p.add_argument("--compile", default="512x1:compile-ro,1024x1:compile,512x1:compile,"
                   "1024x1:compile-ro,512x4:compile-ro,1024x4:compile-ro,512x4:compile,1024x4:compile",
                   help="compile rows in priority order, RESxB:MODE; modes: " + ", ".join(COMPILE_MODES)
                        + " (-memo: given bcgen's prompt memo, benchmarks/sana_prompt_memo.py)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    t_start = time.perf_counter()
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    compile_rows = [(tuple(int(v) for v in c.split(":")[0].split("x")), c.split(":")[1])
                    for c in args.compile.split(",") if c]
    if args.quick:
        configs, compile_rows, args.loops = [(512, 1)], [], 2
    stem = (f"denoise_{device_tag()}" + ("_quick" if args.quick else "") + ("_tiny" if args.tiny else "")
            + (f"_{args.tag}" if args.tag else ""))
    meta = environment()
    rows: list[dict] = []
    refs: dict = {}

    def flush():
        write_results(args.out, stem, rows, COLUMNS, targets(rows), meta)

    model = build_sana(args.device, **(TINY if args.tiny else {}))
    print(f"model ready in {time.perf_counter() - t_start:.1f} s", flush=True)

    def run(mode, res, batch):
        try:
            row, out = measure(mode, model, res, batch, args.loops, refs.get((res, batch)), args.steps)
        except Exception as exc:  # noqa: BLE001 - a failing mode is a row, not a crash
            traceback.print_exc()
            row = {"mode": mode, "resolution": res, "batch": batch,
                   "skipped": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            out = None
        if mode == "eager" and out is not None:
            refs[(res, batch)] = out
        e = next((r for r in rows if r["mode"] == "eager" and r["resolution"] == res
                  and r["batch"] == batch and "denoise_ms" in r), None)
        if e and "denoise_ms" in row:
            row["speedup_vs_eager"] = round(e["denoise_ms"] / row["denoise_ms"], 3)
        rows.append(row)
        flush()
        print({k: v for k, v in row.items() if k != "denoise_all_ms"}, flush=True)

    for res, batch in configs:
        for mode in args.modes.split(","):
            run(mode, res, batch)
    for (res, batch), mode in compile_rows:
        if (res, batch) not in configs:
            continue
        left = args.budget_s - (time.perf_counter() - t_start)
        need = args.max_autotune_row_s if "max-autotune" in mode else args.compile_row_s
        if left < need:
            rows.append({"mode": mode, "resolution": res, "batch": batch,
                         "skipped": f"time budget: {left:.0f} s left of --budget-s {args.budget_s:.0f}, "
                                    f"a {mode} row needs ~{need:.0f} s"})
            flush()
            continue
        run(mode, res, batch)
    print(f"done in {time.perf_counter() - t_start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
