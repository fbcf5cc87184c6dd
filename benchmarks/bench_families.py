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

# transformer/config.json of the released checkpoints (diffusers 0.42.1 class defaults where equal)
REAL = {
    "qwen_image": dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                       num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
                       axes_dims_rope=(16, 56, 56)),  # Qwen/Qwen-Image
    "flux": dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=(16, 56, 56)),  # black-forest-labs/FLUX.1-dev
    "z_image": dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840, n_layers=30,
                    n_refiner_layers=2, n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560,
                    rope_theta=256.0, t_scale=1000.0, axes_dims=[32, 48, 48], axes_lens=[1024, 512, 512]),
    "longcat_image": dict(patch_size=1, in_channels=64, num_layers=10, num_single_layers=20, attention_head_dim=128,
                          num_attention_heads=24, joint_attention_dim=3584, pooled_projection_dim=3584,
                          axes_dims_rope=[16, 56, 56]),  # meituan-longcat/LongCat-Image
}
CLASSES = {"qwen_image": "QwenImageTransformer2DModel", "flux": "FluxTransformer2DModel",
           "z_image": "ZImageTransformer2DModel", "longcat_image": "LongCatImageTransformer2DModel"}
# text the transformer sees: (positive real tokens, text length); CFG negatives use NEG_REAL tokens
TEXT = {"qwen_image": (77, 128), "flux": (77, 512), "z_image": (77, 77), "longcat_image": (77, 512)}
NEG_REAL = 5
CFG_SCALE = {"qwen_image": 4.0, "longcat_image": 4.5}  # the others run one call per step
ALL = {**REAL, **video.REAL}
COLUMNS = ["family", "params_b", "resolution", "steps", "calls_per_step", "text_len", "eager_ms", "bcg_ms",
           "speedup", "ms_saved_per_call", "capture_s", "graphs", "segments", "max_abs_diff", "peak_mem_gib",
           "skipped"]
FUSED_COLUMNS = ["family", "resolution", "steps", "eager_ms", "bcg_ms", "bcg_fused_ms", "fused_gain_vs_bcg_pct",
                 "fused_speedup_vs_eager", "fused_max_abs_diff", "fused_rel_err", "kernels_per_call_eager",
                 "kernels_per_call_fused", "fused_verified", "fused_rejected", "skipped"]


def tiny_configs() -> dict:
    """The tiny presets' transformer configs (conf/model/*_tiny.yaml), for the CPU smoke test."""
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "model"
    return {f: OmegaConf.to_container(OmegaConf.load(conf / f"{video.TINY.get(f, f)}_tiny.yaml"))["model"]["tiny"][
        "transformer"] for f in ALL}


def build(family: str, config: dict, device: str, dtype: torch.dtype):
    import diffusers

    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(diffusers, CLASSES[family])(**config)
    if family == "qwen_image":
        from jobs.models.qwen_image import capturable_text_lengths

        capturable_text_lengths()  # what the family installs when it loads a pipeline
    return model.to(dtype).eval().requires_grad_(False)


def make_step(family: str, config: dict, side: int, device: str, dtype: torch.dtype, tiny: bool):
    """(initial latents, step(forward, lat, t) -> velocity). Inputs built as each pipeline builds them."""
    g = torch.Generator(device).manual_seed(0)
    real, length = TEXT[family]
    if tiny:
        real, length = min(real, 16), min(length, 32 if family != "z_image" else 16)
    width = config.get("joint_attention_dim", config.get("cap_feat_dim"))
    pos = torch.randn(1, length, width, generator=g, device=device).to(dtype)
    neg = torch.randn(1, length, width, generator=g, device=device).to(dtype)
    pos_mask = (torch.arange(length, device=device) < real).long()[None]
    neg_mask = (torch.arange(length, device=device) < NEG_REAL).long()[None]
    tokens = (side // 2) ** 2  # latents packed 2x2

    if family == "z_image":
        lat = torch.randn(1, config["in_channels"], 1, side, side, generator=g, device=device)
        caption = pos[0, :real]

        def step(fwd, lat, t):
            out = fwd([lat[0].to(dtype)], ((1000 - t) / 1000).expand(1), [caption], return_dict=False)[0]
            return -torch.stack([o.float() for o in out])
        return lat, step

    lat = torch.randn(1, tokens, config["in_channels"], generator=g, device=device)
    h = w = side // 2
    if family == "qwen_image":
        shapes = [[(1, h, w)]]

        def step(fwd, lat, t):
            kw = dict(hidden_states=lat.to(dtype), timestep=(t / 1000).expand(1).to(dtype), guidance=None,
                      img_shapes=shapes, attention_kwargs={}, return_dict=False)
            cond = fwd(encoder_hidden_states=pos, encoder_hidden_states_mask=pos_mask, **kw)[0].float()
            uncond = fwd(encoder_hidden_states=neg, encoder_hidden_states_mask=neg_mask, **kw)[0].float()
            comb = uncond + CFG_SCALE[family] * (cond - uncond)
            return comb * (cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))
        return lat, step

    img_ids = torch.zeros(h, w, 3, device=device)
    img_ids[..., 1] += torch.arange(h, device=device)[:, None]
    img_ids[..., 2] += torch.arange(w, device=device)[None, :]
    img_ids = img_ids.reshape(-1, 3)
    if family == "flux":
        txt_ids = torch.zeros(length, 3, device=device)
        pooled = torch.randn(1, config["pooled_projection_dim"], generator=g, device=device).to(dtype)
        guidance = torch.full((1,), 3.5, device=device)

        def step(fwd, lat, t):
            return fwd(hidden_states=lat.to(dtype), timestep=(t / 1000).expand(1).to(dtype), guidance=guidance,
                       pooled_projections=pooled, encoder_hidden_states=pos, txt_ids=txt_ids, img_ids=img_ids,
                       joint_attention_kwargs=None, return_dict=False)[0].float()
        return lat, step

    # longcat_image: text positions 0..S-1 on two axes, image positions offset by the text length
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

    txt_ids = prepare_pos_ids(0, "text", (0, 0), num_token=length).to(device)
    img_ids = prepare_pos_ids(1, "image", (length, length), height=h, width=w).to(device)

    def step(fwd, lat, t):
        ts = (t / 1000).expand(1).to(lat.dtype)
        # as LongCatImagePipeline calls it: guidance=None on the cond call only (two signatures)
        cond = fwd(hidden_states=lat.to(dtype), timestep=ts, guidance=None, encoder_hidden_states=pos,
                   txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0].float()
        uncond = fwd(hidden_states=lat.to(dtype), timestep=ts, encoder_hidden_states=neg, txt_ids=txt_ids,
                     img_ids=img_ids, return_dict=False)[0].float()
        comb = uncond + CFG_SCALE[family] * (cond - uncond)
        scale = (cond.norm(dim=-1, keepdim=True) / (comb.norm(dim=-1, keepdim=True) + 1e-8)).clamp(0.0, 1.0)
        return comb * scale
    return lat, step


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
    ap.add_argument("--modes", default="eager,bcg", help="comma-separated subset of eager,bcg,bcg-fused")
    ap.add_argument("--loops", type=int, default=1, help="timed loops per mode (the median is reported)")
    ap.add_argument("--profile", action="store_true", help="kernels per transformer call (eager, bcg-fused)")
    ap.add_argument("--stem", default="families", help="results file stem (then _<device>[_tiny])")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
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
