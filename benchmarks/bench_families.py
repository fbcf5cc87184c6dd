"""Per-family denoise benchmark: eager vs bcg at real architecture size (random bf16 weights).

One row per family (Qwen-Image, Flux.1-dev, Z-Image, LongCat-Image; and, in benchmarks/families_video.py,
Wan 2.1 1.3B and 14B, SANA-Video, LTX-2 at 480x832x49 and GLM-Image's DiT): the diffusers transformer
class with the released checkpoint's transformer config and seeded random bf16 weights, batch 1,
1024x1024, 20 flow-matching Euler steps (plain Euler update), denoise loop only (random text
embeddings of the encoder's width and the family's text length; no text encoder, no VAE). Each
step calls the transformer the way its pipeline does: Qwen-Image and LongCat-Image run two calls
(CFG), Flux.1-dev one (distilled guidance), Z-Image one (Turbo, no CFG). Modes (--modes):
eager; bcg: the whole forward as one graph (break policy "none", fusions off), captured during the
first (untimed) loop; bcg-fused: the same graph of the lossless fused forward (bcg/fusions,
`fusions="lossless"`; families without a fusion rule skip it). --profile adds kernels per call.

    python benchmarks/bench_families.py --out benchmarks/results          # H200, the image families
    python benchmarks/bench_families.py --families wan,wan_14b,sana_video,ltx2,glm_image --steps 20 \
        --out benchmarks/results                                          # H200, video families (+ GLM-Image)
    python benchmarks/bench_families.py --families minimax_h3 --steps 20 --out benchmarks/results
                                                                          # H200, MiniMax-H3 30B (~62 GB bf16)
    python benchmarks/bench_families.py --tiny --out /tmp/smoke           # CPU smoke test (tape)
    python benchmarks/bench_families.py --families z_image --loops 3 --profile --stem fusions_z_image \
        --out benchmarks/results                                          # H200, eager vs bcg vs bcg-fused
    python benchmarks/bench_families.py --table fused --families flux,qwen_image,wan --out benchmarks/results
                                      # H200: families_fused_h200.json, a row per (family, batch, mode),
                                      # eager / bcg / bcg-fused / compile-ro (benchmarks/families_fused.py)

Rows are written after each family, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (LoopTimer, device_tag, environment, flow_schedule, kernel_profile, sync,  # noqa: E402
                    write_results)

from bcg import RunnerConfig, apply_graph_runner  # noqa: E402
from bcg.fusions import RULES  # noqa: E402
import families_video as video  # noqa: E402
from families_image import CFG_SCALE, REAL, TEXT, build, make_step, tiny_configs  # noqa: E402

ALL = {**REAL, **video.REAL}
COLUMNS = ["family", "params_b", "resolution", "steps", "calls_per_step", "text_len", "eager_ms", "bcg_ms",
           "speedup", "ms_saved_per_call", "capture_s", "graphs", "segments", "max_abs_diff", "peak_mem_gib",
           "skipped"]
FUSED_COLUMNS = ["family", "resolution", "steps", "eager_ms", "bcg_ms", "bcg_fused_ms", "fused_gain_vs_bcg_pct",
                 "fused_speedup_vs_eager", "fused_max_abs_diff", "fused_rel_err", "kernels_per_call_eager",
                 "kernels_per_call_fused", "fused_verified", "fused_rejected", "skipped"]


def run_family(family: str, args, device: str, dtype: torch.dtype) -> dict:
    config = tiny_configs()[family] if args.tiny else ALL[family]
    row = {"family": family, "steps": args.steps}
    if family in video.REAL:
        model = video.build(family, config, device, dtype)
        lat0, step, info = video.make_step(family, model, args.tiny, device, dtype)
        row.update(info)
    else:
        resolution = 64 if args.tiny else args.resolution
        side = resolution // 8  # the 8x VAEs of all four families
        row.update(resolution=f"{resolution}x{resolution}", calls_per_step=2 if family in CFG_SCALE else 1,
                   text_len=TEXT[family][1])
        model = build(family, config, device, dtype)
        lat0, step = make_step(family, config, side, device, dtype, args.tiny)
    row["params_b"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    timesteps, sigmas = flow_schedule(args.steps, shift=3.0, device=device)

    def loop(fwd):
        lat = lat0.clone()
        for i, t in enumerate(timesteps):
            lat = lat + (sigmas[i + 1] - sigmas[i]) * step(fwd, lat, t)
        return lat

    def timed(fwd) -> tuple[float, torch.Tensor]:
        """Median ms of --loops timed loops, and the last loop's latents."""
        times, out = [], None
        for _ in range(args.loops):
            with LoopTimer() as t:
                out = loop(fwd)
            times.append(t.ms)
        return sorted(times)[len(times) // 2], out

    def kernels_per_call(fwd) -> float:
        return kernel_profile(lambda: step(fwd, lat0, timesteps[0]), row["calls_per_step"])["kernels_per_step"]

    modes = args.modes.split(",")
    calls = args.steps * row["calls_per_step"]
    backend = "cuda" if torch.cuda.is_available() else "tape"
    with torch.no_grad():
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        step(model, lat0, timesteps[0])  # warm-up: kernels, workspaces, RoPE caches
        eager_ms, ref = timed(model)
        row["eager_ms"] = round(eager_ms, 1)
        if args.profile:
            row["kernels_per_call_eager"] = kernels_per_call(model)
        for mode in [m for m in modes if m != "eager"]:
            fused = mode == "bcg-fused"
            if fused and not any(r.target in {type(m).__name__ for m in model.modules()} for r in RULES.values()):
                row["fused_skipped"] = "no fusion rule for this family"
                continue
            runner = apply_graph_runner(model, RunnerConfig(backend=backend, fusions="lossless" if fused else "off"),
                                        break_policy="none")
            try:
                t0 = time.perf_counter()
                loop(model)  # warm-up forwards (fusions: verification), capture, then replays
                sync()
                first_loop_s = time.perf_counter() - t0
                ms, out = timed(model)
                if fused and args.profile:
                    row["kernels_per_call_fused"] = kernels_per_call(model)
                stats = runner.stats()
            finally:
                runner.remove()
            assert stats["misses"] == 0 and stats["capture_failures"] == 0, stats
            diff = float((out - ref).abs().max())
            if fused:
                fx = stats.get("fusions", {})
                row.update(bcg_fused_ms=round(ms, 1), fused_max_abs_diff=diff,
                           fused_rel_err=float((out - ref).norm() / ref.norm()),
                           fused_speedup_vs_eager=round(eager_ms / ms, 3),
                           fused_verified=fx.get("verified"), fused_rejected=fx.get("rejected"),
                           fused_rejections=fx.get("rejections"), fused_modules=fx.get("modules"),
                           fused_calls=fx.get("fused_calls"), fused_eager_calls=fx.get("eager_calls"))
            else:
                row.update(bcg_ms=round(ms, 1), speedup=round(eager_ms / ms, 3),
                           ms_saved_per_call=round((eager_ms - ms) / calls, 3),
                           capture_s=round(stats["capture_seconds"], 2), graphs=stats["captures"],
                           segments=stats["segments"], max_abs_diff=diff)
            logging.info("%s %s: %.1f ms (first loop %.1f s incl. capture)", family, mode, ms, first_loop_s)
            del out
    if "bcg_ms" in row and "bcg_fused_ms" in row:
        row["fused_gain_vs_bcg_pct"] = round(100 * (1 - row["bcg_fused_ms"] / row["bcg_ms"]), 1)
    row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1) if torch.cuda.is_available() else None
    logging.info("%s: %s", family, row)
    del model, ref
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--families", default=",".join(REAL), help="comma-separated subset of " + ",".join(ALL))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--resolution", type=int, default=1024)
    ap.add_argument("--tiny", action="store_true", help="tiny preset configs, float32 (CPU smoke test)")
    ap.add_argument("--modes", default=None, help="comma-separated subset of eager,bcg,bcg-fused (--table fused: "
                    "also compile-ro; default all four; else eager,bcg)")
    ap.add_argument("--loops", type=int, default=None, help="timed loops per mode, the median reported (default 1; "
                    "--table fused: 3)")
    ap.add_argument("--profile", action="store_true", help="kernels per transformer call (eager, bcg-fused)")
    ap.add_argument("--stem", default="families", help="results file stem (then _<device>[_tiny])")
    ap.add_argument("--table", choices=("wide", "fused"), default="wide",
                    help="wide: one row a family (eager / bcg / bcg-fused); fused: one row a (family, batch, mode) "
                         "with compile-ro and the kernel-time mix (benchmarks/families_fused.py)")
    ap.add_argument("--batches", default="1,job", help="--table fused: batch sizes; 'job' = the pool's largest a "
                    "long sorted job cuts (8 image, 2 video)")
    ap.add_argument("--compile", choices=("full", "regional"), default=None,
                    help="--table fused compile-ro: the whole model (default), or each repeated block (less "
                         "compile time; --quick's default)")
    ap.add_argument("--init", choices=("normal", "diffusers"), default="normal",
                    help="--table fused: matrices normal_(0, 0.02) or diffusers' own init")
    ap.add_argument("--quick", action="store_true", help="--table fused: 2 steps, 3 loops, batch 1, regional "
                    "compile (several families in one ~6 min device call)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    unknown = [f for f in args.families.split(",") if f not in ALL]
    if unknown:
        raise ValueError(f"--families: {unknown} not among {', '.join(ALL)}")
    if args.table == "fused":
        import families_fused

        args.modes = args.modes or ",".join(families_fused.MODES)
        args.loops = args.loops or 3
        families_fused.run_all(args)
        return
    args.modes, args.loops = args.modes or "eager,bcg", args.loops or 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    meta = environment()
    rows = []
    for family in args.families.split(","):
        if family not in ALL:
            raise ValueError(f"--families: {family!r} is not one of {', '.join(ALL)}")
        try:
            rows.append(run_family(family, args, device, dtype))
        except Exception as e:  # keep the other rows; say what failed
            traceback.print_exc()
            rows.append({"family": family, "skipped": f"{type(e).__name__}: {str(e)[:120]}"})
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        stem = f"{args.stem}_{device_tag()}" + ("_tiny" if args.tiny else "")
        notes = [
            "Random bf16 weights with each released checkpoint's transformer config; denoise loop only "
            "(random text embeddings of the encoder's width), batch 1, plain Euler update.",
            "calls_per_step: Qwen-Image and LongCat-Image run CFG as two transformer calls (as their pipelines "
            "do), Flux.1-dev one (distilled guidance), Z-Image one (Turbo, no CFG).",
            "text_len: what the transformer sees: Qwen-Image's bucket (77 real tokens -> 128), Flux's T5 512, "
            "Z-Image's native caption (77), LongCat's fixed 512.",
            f"eager_ms / bcg_ms: the median of {args.loops} timed {args.steps}-step loop(s) each (CUDA events), after "
            "a warm-up call and, for bcg, after the untimed loop that captured. graphs: signatures captured (LongCat's pipeline passes "
            "guidance=None on the cond call only, so its two CFG calls are two graphs). max_abs_diff: final "
            "latents, bcg vs eager.",
            "Video families (benchmarks/families_video.py): 480x832, 49 frames; Wan 2.1 (1.3B, 14B) two CFG calls "
            "a step on 512 UMT5 rows; SANA-Video one call on the CFG batch of 2, text bucket 128; LTX-2 three calls "
            "(CFG batch 2, spatio-temporal guidance, modality isolation), 1024 text rows, video and audio latents; "
            "GLM-Image's DiT at 1024x1024, two calls (prior tokens kept, dropped), the family's graph-friendly calls.",
            "MiniMax-H3 (30B): 480x832x124 (its shortest clip), one call a step on one packed sequence (77 text, "
            "414 audio, 14430 video rows), two distinct timesteps; float32 modules kept as the checkpoint has them.",
        ]
        if "bcg-fused" in args.modes:
            notes.append("bcg-fused: the bcg graph of the lossless fused forward (RunnerConfig(fusions='lossless'); "
                         "bcg runs fusions='off'). fused_gain_vs_bcg_pct = 1 - bcg_fused_ms / bcg_ms; fused_rel_err "
                         "and fused_max_abs_diff: final latents vs eager (0 = bit-exact). fused_verified / "
                         "fused_rejected: (chain, shape) pairs the verifier compared with eager on first sight; "
                         "the JSON lists each rejection. kernels_per_call: GPU kernels of one transformer call "
                         "(profiler; bcg-fused counted on graph replay).")
        write_results(args.out, stem, rows, FUSED_COLUMNS if "bcg-fused" in args.modes else COLUMNS, notes, meta)


if __name__ == "__main__":
    main()
