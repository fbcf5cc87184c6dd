"""The whole job at real size: SANA-1.6B built from real diffusers/transformers classes with
published configs and random weights, saved as a diffusers folder and run through the real preset.

    python benchmarks/bench_job_realsize.py build --dir /tmp/sana16          # ~2B text encoder + 1.6B DiT + DC-AE
    python benchmarks/bench_job_realsize.py build --family flux --dir /tmp/flux   # Flux.1-dev: 11.9B DiT + T5 + CLIP
    python benchmarks/bench_job_realsize.py run --dir /tmp/sana16 --res 512 --modes bcg,plain8 &   # GPU 0
    CUDA_VISIBLE_DEVICES=1 python benchmarks/bench_job_realsize.py run --dir /tmp/sana16 --res 512 --modes off,plain1
    python benchmarks/bench_job_realsize.py report --res 512 --out benchmarks/results

Modes, all at the same steps, size and guidance, on the same prompts (benchmarks/data/realistic_prompts.jsonl,
510 prompts of 1 to ~400 tokens, the bundled set before the demo model's):
    bcg       python -m jobs.generate model=sana model.path=DIR ...   (the default job)
    off       the same with bcg=off
    plainN    a plain diffusers loop: SanaPipeline.from_pretrained(DIR) called on N prompts at a
              time with output_type="pil" (what a user writes instead of bcgen; it writes no files)
Each mode runs in its own process. Per mode: images/s over the generation stage and over the
whole wall time, GPU busy over the generation stage (NVML, jobs/telemetry/gpu_monitor.py), the job's stage
breakdown and graph counters, and whether bcg's bytes equal `off`'s.

Components (published configs; vocabularies cut to the offline MiniLM tokenizer's 30,522):
    transformer   Efficient-Large-Model/Sana_1600M_1024px diffusers transformer config (common.SANA_1600M)
    text encoder  google/gemma-2-2b config (Gemma2Model: 26 layers, 2304 wide, 8 heads / 4 kv)
    vae           mit-han-lab/dc-ae-f32c32-sana-1.0 (AutoencoderDC)
    scheduler     FlowMatchEulerDiscreteScheduler(shift=3.0), as in bench_denoise.py
Weights: normal_(0, 0.02) for every float tensor of dim >= 2, biases zero, norms one.

`build --family flux` (the `run` and `report` commands here are SANA's; for Flux use
bench_job_wall.py --family flux): FluxPipeline's components with published configs, random weights
as above, bf16, each built on the GPU when there is one, saved and freed in turn (~33 GB on disk):
    transformer     FluxTransformer2DModel of black-forest-labs/FLUX.1-dev (FLUX_DEV_TRANSFORMER: 19 double
                    + 38 single blocks, 24 heads x 128, guidance embedding; ~11.9B)
    text_encoder_2  T5EncoderModel with google/t5-v1_1-xxl's config (T5_V1_1_XXL: 24 layers, 4096 wide,
                    64 heads x 64, d_ff 10240 gated-gelu; ~4.7B); vocabulary 32,128 cut to 30,522
    text_encoder    CLIPTextModel with openai/clip-vit-large-patch14's text config (CLIP_L14_TEXT:
                    12 layers, 768 wide, 12 heads, 77 positions); vocabulary 49,408 cut to 30,522
    vae             AutoencoderKL of FLUX.1-dev (FLUX_DEV_VAE: 16 latent channels, 8x)
    scheduler       FlowMatchEulerDiscreteScheduler with FLUX.1-dev's scheduler config (FLUX_DEV_SCHEDULER)
    tokenizer(_2)   the offline MiniLM WordPiece tokenizer for both (CLIP's capped at 77 tokens; CLIP pools
                    at MiniLM's [SEP], its eos), as conf/model/flux_tiny.yaml does
`--tiny` builds the same classes and folder layout with a few narrow layers (a CPU test in seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GEMMA2_2B = dict(vocab_size=30522, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                 hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=4096,
                 final_logit_softcapping=30.0, attn_logit_softcapping=50.0, rms_norm_eps=1e-6,
                 pad_token_id=0, bos_token_id=101, eos_token_id=102)
DC_AE_F32C32_SANA = dict(
    in_channels=3, latent_channels=32, attention_head_dim=32,
    encoder_block_types=["ResBlock", "ResBlock", "ResBlock", "EfficientViTBlock", "EfficientViTBlock",
                         "EfficientViTBlock"],
    decoder_block_types=["ResBlock", "ResBlock", "ResBlock", "EfficientViTBlock", "EfficientViTBlock",
                         "EfficientViTBlock"],
    encoder_block_out_channels=[128, 256, 512, 512, 1024, 1024], decoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
    encoder_layers_per_block=[2, 2, 2, 3, 3, 3], decoder_layers_per_block=[3, 3, 3, 3, 3, 3],
    encoder_qkv_multiscales=[[], [], [], [5], [5], [5]], decoder_qkv_multiscales=[[], [], [], [5], [5], [5]],
    upsample_block_type="interpolate", downsample_block_type="Conv", decoder_norm_types="rms_norm",
    decoder_act_fns="silu", scaling_factor=0.41407,
)
# Flux.1-dev (black-forest-labs/FLUX.1-dev, its diffusers folder's config.json files), checked
# against the installed classes' signatures (diffusers 0.42, transformers 5).
FLUX_DEV_TRANSFORMER = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                            pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
# google/t5-v1_1-xxl (FLUX.1-dev's text_encoder_2 is its encoder). Ids: MiniLM's pad 0 and [SEP] 102
# for T5's pad 0 / eos 1. Its tie_word_embeddings=False is not set: T5EncoderModel has no LM head.
T5_V1_1_XXL = dict(vocab_size=30522, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.1,
                   pad_token_id=0, eos_token_id=102, decoder_start_token_id=0, use_cache=False)
# openai/clip-vit-large-patch14's text_config (FLUX.1-dev's text_encoder). Ids: MiniLM's [CLS] 101,
# [SEP] 102, [PAD] 0 for CLIP's 49406 / 49407 / 1 (eos 102 != 2: CLIP pools at the first [SEP]).
CLIP_L14_TEXT = dict(vocab_size=30522, hidden_size=768, intermediate_size=3072, projection_dim=768,
                     num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                     hidden_act="quick_gelu", layer_norm_eps=1e-5, bos_token_id=101, eos_token_id=102,
                     pad_token_id=0)
FLUX_DEV_VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=[128, 256, 512, 512],
                    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                    layers_per_block=2, norm_num_groups=32, act_fn="silu", sample_size=1024,
                    scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
                    force_upcast=True, mid_block_add_attention=True)
FLUX_DEV_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                          max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
# --tiny: the same classes and layout, narrow (conf/model/flux_tiny.yaml's sizes; 4 VAE blocks kept: 8x)
FLUX_TINY = dict(
    transformer=dict(num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                     joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)),
    text_encoder_2=dict(d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, relative_attention_num_buckets=8),
    text_encoder=dict(hidden_size=32, intermediate_size=64, projection_dim=32, num_hidden_layers=1,
                      num_attention_heads=2),
    vae=dict(block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=8),
)
# The realistic length mix the committed results were measured on (1 to ~400 tokens): the bundled
# set until the demo model's vocabulary replaced it (jobs/data/prompts.jsonl).
PROMPTS = ROOT / "benchmarks" / "data" / "realistic_prompts.jsonl"


def randomize(module, seed: int, on_device: bool = False) -> None:
    """normal_(0, 0.02) for every float tensor of dim >= 2, biases zero, the rest as built. The draws
    come from a CPU generator (SANA's folder, as its committed results were built), or with
    `on_device` from one on the parameters' own device (Flux's 12B: CPU draws would take minutes)."""
    import torch

    g = None
    with torch.no_grad():
        for name, p in module.named_parameters():
            if g is None:
                g = torch.Generator(device=p.device if on_device else "cpu").manual_seed(seed)
            if p.dim() >= 2:
                if on_device:
                    p.normal_(0.0, 0.02, generator=g)
                else:
                    p.copy_(torch.randn(p.shape, generator=g).mul_(0.02).to(p.dtype))
            elif name.endswith("bias"):
                p.zero_()


def build(args) -> None:
    if args.family == "flux":
        return build_flux(args)
    import torch
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import AutoTokenizer, Gemma2Config, Gemma2Model

    from common import SANA_1600M

    t0 = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    tr_cfg = dict(SANA_1600M)
    te_cfg, vae_cfg = dict(GEMMA2_2B), dict(DC_AE_F32C32_SANA)
    if args.tiny:  # a CPU smoke test of this script: the same classes, a few layers
        tr_cfg.update(num_layers=1, num_attention_heads=4, cross_attention_dim=128, num_cross_attention_heads=2,
                      cross_attention_head_dim=32, caption_channels=64)
        te_cfg.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32)
        vae_cfg.update(encoder_block_out_channels=[8, 8, 16, 16, 32, 32], decoder_block_out_channels=[8, 8, 16, 16, 32, 32],
                       encoder_layers_per_block=[1] * 6, decoder_layers_per_block=[1] * 6, attention_head_dim=8)
    with torch.device(dev):
        transformer = SanaTransformer2DModel(**tr_cfg).to(torch.bfloat16)
        text_encoder = Gemma2Model(Gemma2Config(**te_cfg)).to(torch.bfloat16)
        vae = AutoencoderDC(**vae_cfg).to(torch.bfloat16)
    for i, m in enumerate((transformer, text_encoder, vae)):
        randomize(m, seed=i)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    pipe = SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe.save_pretrained(args.dir, safe_serialization=True)
    n = {k: sum(p.numel() for p in m.parameters()) / 1e9 for k, m in
         (("transformer", transformer), ("text_encoder", text_encoder), ("vae", vae))}
    print(json.dumps({"built": args.dir, "params_billion": {k: round(v, 3) for k, v in n.items()},
                      "seconds": round(time.perf_counter() - t0, 1)}))


def build_flux(args) -> None:
    """Flux.1-dev's folder, one component at a time: build on the device, randomize, save, free.
    model_index.json is what FluxPipeline.save_pretrained writes for these classes."""
    import diffusers
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    t0 = time.perf_counter()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    cfgs = {"transformer": dict(FLUX_DEV_TRANSFORMER), "text_encoder_2": dict(T5_V1_1_XXL),
            "text_encoder": dict(CLIP_L14_TEXT), "vae": dict(FLUX_DEV_VAE)}
    if args.tiny:
        for name, small in FLUX_TINY.items():
            cfgs[name].update(small)
    makers = {"transformer": lambda c: FluxTransformer2DModel(**c),
              "text_encoder_2": lambda c: T5EncoderModel(T5Config(**c)),
              "text_encoder": lambda c: CLIPTextModel(CLIPTextConfig(**c)),
              "vae": lambda c: AutoencoderKL(**c)}
    params, index = {}, {}
    for seed, (name, make) in enumerate(makers.items()):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy of 12B parameters on the way
        try:
            with torch.device(dev):
                module = make(cfgs[name]).eval()
        finally:
            torch.set_default_dtype(default)
        randomize(module, seed, on_device=True)
        module.save_pretrained(out / name, safe_serialization=True)
        params[name] = round(sum(p.numel() for p in module.parameters()) / 1e9, 3)
        lib = "diffusers" if isinstance(module, diffusers.ModelMixin) else "transformers"
        index[name] = [lib, type(module).__name__]
        del module
        if dev == "cuda":
            torch.cuda.empty_cache()
    for name, max_len in (("tokenizer", 77), ("tokenizer_2", None)):  # CLIP's 77 tokens; T5's is MiniLM's 512
        tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True,
                                            **({"model_max_length": max_len} if max_len else {}))
        tok.save_pretrained(out / name)
        index[name] = ["transformers", type(tok).__name__]
    FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER).save_pretrained(out / "scheduler")
    index["scheduler"] = ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    index = {"_class_name": "FluxPipeline", "_diffusers_version": diffusers.__version__,
             "feature_extractor": [None, None], "image_encoder": [None, None], **dict(sorted(index.items()))}
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(json.dumps({"built": str(out), "family": "flux", "tiny": bool(args.tiny), "device": dev,
                      "params_billion": params, "gb_on_disk": round(size / 1e9, 2),
                      "seconds": round(time.perf_counter() - t0, 1)}))


# -- modes ---------------------------------------------------------------------------------
JOB_MODES = {
    # the default job: overlapped stages, capture every key (always), fused kernels, the pool as configured,
    # and on CUDA the batch-invariant mode (bcg.invariant=null, since session 52)
    "bcg": [],
    # the fast path, the default job before session 52: the batch-dependent kernels (the pool is in the identity)
    "bcg-variant": ["bcg.invariant=false"],
    "bcg-nofuse": ["bcg.fusions=off"],  # the job around the denoiser alone (issue 9's 1.1x target)
    # The pool as configured: bytes are compared with `bcg`, whose pool is the default [8] (up to
    # session 31: [1, 2, 4, 8]) unless its report's `batch` column says it grew (then compare with
    # an off run at that pool).
    "off": ["bcg=off", "bcg.batch_grow=off"],
    "bcg-serial": ["job.overlap=false"],  # stages one after another (the old engine's order)
    "bcg-auto": ["bcg.capture=auto"],  # captures only what its measurement says pays (the default before s28)
    "bcg-b16": ["bcg.batch_sizes=[1,2,4,8,16]"],
    "bcg-b32": ["bcg.batch_sizes=[1,2,4,8,16,32]"],
    "off-b16": ["bcg=off", "bcg.batch_sizes=[1,2,4,8,16]"],
    # Issue 30's contract over the whole job: the batch-invariant kernels (every stage), and the
    # fixed-shape form (one pool size, short tails padded: neighbours and position no longer matter),
    # the default since session 31; bcg-pool1248 is the default before it.
    "bcg-invariant": ["bcg.invariant=true"],
    # the mode at another pool: its bytes must be bcg-invariant's (--bytes-against bcg-invariant)
    "bcg-invariant-pool1248": ["bcg.invariant=true", "bcg.batch_sizes=[1,2,4,8]"],
    "bcg-fixed8": ["bcg.batch_sizes=[8]"],
    "bcg-pool1248": ["bcg.batch_sizes=[1,2,4,8]"],
    # the default job before session 34: the VAE decoder's blocks unfused (bcg/fusions/dc_ae.py)
    "bcg-nodecfuse": ["bcg.decoder_fusions=false"],
}


def job_overrides(args) -> list:
    return ["model=sana", f"model.path={args.dir}", f"dataset.path={args.prompts}",
            f"sampling.height={args.res}", f"sampling.width={args.res}", f"sampling.steps={args.steps}",
            f"sampling.guidance_scale={args.guidance}", "job.progress=false", *args.extra]


def run_job(args, mode: str, out_dir: str) -> dict:
    extra = JOB_MODES[mode]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "jobs.generate", f"output_dir={out_dir}", *job_overrides(args), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    s = json.loads((Path(out_dir) / "summary.json").read_text())
    st, g = s["stage_seconds"], s["graph"]
    pool = s.get("batching", {}).get("sizes") or _batch_sizes(args.extra + extra)
    return {"mode": mode, "resolution": args.res, "batch": max(int(b) for b in pool),
            "batch_sizing_s": st.get("batch_sizing"), "batching": s.get("batching", {}),
            "items": s["items_written"], "images_per_s": round(s["images_per_s"], 3),
            "images_per_s_wall": round(s["items_written"] / wall, 3), "wall_s": round(wall, 1),
            "gpu_busy": s.get("gpu_busy"), "plan_s": st.get("plan"), "load_s": st.get("load"),
            "generate_s": st.get("generate"), "sink_wait_s": st.get("sink_wait"),
            "gpu_encode_s": _s(s, "encode"), "gpu_denoise_s": _s(s, "denoise"), "gpu_decode_s": _s(s, "decode"),
            "captures": g.get("captures", 0), "capture_s": round(g.get("capture_seconds", 0.0), 2),
            "hits": g.get("hits", 0), "declined": g.get("declined", 0), "misses": g.get("misses", 0),
            "policy": s.get("capture_policy", [])}


def _s(summary: dict, stage: str):
    ms = summary.get("gpu_stage_ms", {}).get(stage)
    return None if ms is None else round(ms / 1e3, 2)


def _batch_sizes(overrides):
    for e in reversed(overrides):
        if e.startswith("bcg.batch_sizes="):
            return [int(v) for v in e.split("=", 1)[1].strip("[]").split(",")]
    return [8]  # the image presets' default pool (jobs/config.py BcgConfig.batch_sizes)


def run_plain(args, batch: int, limit: int) -> dict:
    """A plain diffusers loop in a child process (its own memory), timed by that process."""
    code = PLAIN_LOOP.format(root=str(ROOT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-c", code, args.dir, str(args.prompts), str(args.res), str(args.steps),
           str(args.guidance), str(batch), str(limit)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"plain loop failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"mode": f"plain{batch}", "resolution": args.res, "batch": batch, **r}


PLAIN_LOOP = r'''
import json, sys, time
sys.path.insert(0, {root!r})
import torch
from diffusers import SanaPipeline
from jobs.telemetry.gpu_monitor import GpuMonitor
path, prompts, res, steps, guidance, batch, limit = sys.argv[1:]
res, steps, guidance, batch, limit = int(res), int(steps), float(guidance), int(batch), int(limit)
t0 = time.perf_counter()
texts = [json.loads(l)["prompt"] for l in open(prompts)][:limit]
pipe = SanaPipeline.from_pretrained(path, torch_dtype=torch.bfloat16, local_files_only=True).to("cuda")
pipe.set_progress_bar_config(disable=True)
load = time.perf_counter() - t0
def call(chunk, seed):
    g = [torch.Generator("cpu").manual_seed(seed + i) for i in range(len(chunk))]
    return pipe(prompt=chunk, negative_prompt="", guidance_scale=guidance, num_inference_steps=steps,
                height=res, width=res, generator=g, output_type="pil", use_resolution_binning=False).images
call(texts[:batch], 0)  # warm-up (cuDNN/cuBLAS autotuning), not timed
torch.cuda.synchronize()
mon = GpuMonitor(torch.device("cuda"))
t1 = time.perf_counter()
with mon:
    n = 0
    for i in range(0, len(texts), batch):
        n += len(call(texts[i:i + batch], i))
gen = time.perf_counter() - t1
wall = time.perf_counter() - t0
print(json.dumps({{"items": n, "images_per_s": round(n / gen, 3), "images_per_s_wall": round(n / wall, 3),
                  "wall_s": round(wall, 1), "generate_s": round(gen, 2), "load_s": round(load, 1),
                  "gpu_busy": mon.busy()}}))
'''


def bytes_equal(a: str, b: str) -> tuple:
    """(equal, total): samples whose image bytes are identical in two output folders."""
    import tarfile

    def images(d):
        out = {}
        for tar in sorted(Path(d).glob("shard-*.tar")):
            with tarfile.open(tar) as t:
                for m in t.getmembers():
                    if m.name.rsplit(".", 1)[-1] in ("jpg", "png", "webp"):
                        out[m.name] = t.extractfile(m).read()
        return out

    x, y = images(a), images(b)
    return sum(1 for k in x if y.get(k) == x[k]), len(x)


def run(args) -> None:
    """Run each mode; each writes `<work>/<res>-<mode>.json` (its row) and keeps its output folder,
    so modes can run on several GPUs at once and `report` merges them."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        if mode.startswith("plain"):
            batch = int(mode[len("plain"):])
            row = run_plain(args, batch, args.plain_limit.get(batch, 10**9))
        else:
            row = run_job(args, mode, str(work / f"{args.res}-{mode}"))
        row["steps"], row["guidance"] = args.steps, args.guidance
        (work / f"{args.res}-{mode}.json").write_text(json.dumps(row) + "\n")
        print(f"{args.res} {mode}: {row['images_per_s']} images/s ({time.perf_counter() - t0:.0f}s)", flush=True)


def report(args) -> None:
    import torch

    from common import device_tag, environment

    work = Path(args.work)
    rows = [json.loads(p.read_text()) for p in sorted(work.glob(f"{args.res}-*.json"))]
    order = ["bcg", "bcg-nofuse", "bcg-b16", "bcg-b32", "bcg-serial", "off", "off-b16", "plain8", "plain1"]
    rows.sort(key=lambda r: order.index(r["mode"]) if r["mode"] in order else len(order))
    off_dir = work / f"{args.res}-off"
    for r in rows:
        mine = work / f"{args.res}-{r['mode']}"
        if r["mode"] != "off" and mine.is_dir() and off_dir.is_dir():
            eq, total = bytes_equal(str(mine), str(off_dir))
            r["bytes_equal_off"] = f"{eq}/{total}"
    plain8 = next((r["images_per_s"] for r in rows if r["mode"] == "plain8"), None)
    off = next((r["images_per_s"] for r in rows if r["mode"] == "off"), None)
    for r in rows:
        r["vs_plain8"] = round(r["images_per_s"] / plain8, 3) if plain8 else None
        r["vs_off"] = round(r["images_per_s"] / off, 3) if off else None
    meta = environment()
    steps = rows[0]["steps"] if rows else None
    meta.update(steps=steps, guidance=rows[0]["guidance"] if rows else None, prompts=str(args.prompts),
                gpu_total_gb=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
                if torch.cuda.is_available() else None,
                commands=args.commands)
    stem = f"job_realsize_{args.res}_{device_tag()}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    cols = ["mode", "batch", "items", "images_per_s", "vs_plain8", "vs_off", "images_per_s_wall", "gpu_busy",
            "plan_s", "load_s", "batch_sizing_s", "generate_s", "gpu_encode_s", "gpu_denoise_s", "gpu_decode_s", "sink_wait_s",
            "captures", "capture_s", "hits", "declined", "bytes_equal_off"]
    lines = [f"# Whole job at SANA-1.6B size, {args.res}², {steps} steps, CFG {meta['guidance']}", "",
             f"- date: {meta['date']}; gpu: {meta['gpu']}, torch {meta['torch']}",
             f"- commands: `{args.commands or meta['command']}`",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("—" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    lines += ["", "Batch sizing (jobs/worker/batch_sizer.py):", ""]
    for r in rows:
        b = r.get("batching") or {}
        if b:
            probes = ", ".join(f"{p['batch']}: {p['cost_ms']:.1f} ms/image" for p in b.get("probes", []))
            lines.append(f"- {r['mode']}: pool {b['sizes']} ({b['source']}; {b['reason']}){'; ' + probes if probes else ''}")
    lines += ["", "Capture policy decisions:", ""]
    for r in rows:
        for d in r.get("policy", []):
            lines.append(f"- {r['mode']}: {d['signature']} batch {d['batch']}: {d['reason'] or d['decision']}")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--dir", required=True)
    b.add_argument("--tokenizer", default=str(ROOT / ".minilm"))
    b.add_argument("--tiny", action="store_true", help="CPU smoke test of the script: one-layer components")
    b.add_argument("--family", choices=["sana", "flux"], default="sana",
                   help="sana: SANA-1.6B (default); flux: Flux.1-dev")
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--res", type=int, default=512)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--guidance", type=float, default=4.5)
    r.add_argument("--prompts", type=Path, default=PROMPTS)
    r.add_argument("--modes", default="bcg,off,plain8,plain1",
                   help=f"comma list of {', '.join(JOB_MODES)}, plainN")
    r.add_argument("--plain-limit", type=lambda t: {int(k): int(v) for k, v in (kv.split(":") for kv in t.split(","))},
                   default={1: 64}, help="prompts per plain batch size, e.g. 1:64,8:256 (the rest: all)")
    r.add_argument("--extra", nargs="*", default=[], help="more job overrides for every job mode")
    r.add_argument("--work", default="/tmp/bcgen-realsize")
    rp = sub.add_parser("report")
    rp.add_argument("--res", type=int, default=512)
    rp.add_argument("--work", default="/tmp/bcgen-realsize")
    rp.add_argument("--prompts", type=Path, default=PROMPTS)
    rp.add_argument("--commands", default="", help="the run commands, for the record")
    rp.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    {"build": build, "run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
