"""Train the sana_tiny demo model on drawn scenes: AutoencoderDC first, then SanaTransformer2DModel.

    python tools/train_demo.py --out jobs/data/demo --write-preset         # from scratch (GPU)
    python tools/train_demo.py --out jobs/data/demo --resume jobs/data/demo --dit-minutes 7
                                                                           # train the shipped ones on (GPU)
    python tools/train_demo.py --out /tmp/demo --device cpu --vae-steps 30 --dit-steps 30 \
        --vae-batch 8 --dit-batch 8 --pool 500 --long-pool 50                # a smoke run

The architecture is the preset's (conf/model/sana_tiny.yaml, `model.tiny`), built with the real
diffusers classes. Data are drawn at training time (jobs/demo/scenes.py): one shape of one colour on
a background of another, captioned in the training phrasings (jobs/demo/captions.py; the held-out
phrasings are never used here). The frozen MiniLM encoder embeds every caption as SanaPipeline
does at inference (jobs/demo/text.py).

1. VAE: reconstruction (L1 + MSE) of drawn scenes, the decoder also fed slightly noised latents so
   that it forgives the transformer's small errors. Its latent scale (1/RMS) becomes the VAE's
   `scaling_factor` (`--write-preset` writes it into the preset).
2. Transformer: rectified flow as SanaPipeline samples it (FlowMatchEulerDiscreteScheduler):
   x_t = (1 - s) x0 + s n, target n - x0, timestep 1000 s, s drawn from the preset's shifted
   schedule (and a fifth uniformly); the caption replaced by the empty prompt with probability
   --cfg-drop, since the job samples with classifier-free guidance; EMA weights are saved.
   The step is small (256 latent tokens, 1.2 M parameters), so on a GPU it is bound by kernel
   launches and host waits, not arithmetic: batches are large (1024), padded to one fixed text
   length (no host-device sync to size them), and the loss is `torch.compile`d (a compiler
   failure falls back to eager, `--compile off` skips it).

`--resume DIR` keeps DIR's VAE and continues its transformer (EMA) weights with a fresh optimizer;
DIR may be --out itself (it is read before anything is written).

Each phase runs `--*-steps` or `--*-minutes` of wall time, whichever runs out first, and its
cosine learning rate reaches its floor exactly then (training.json records the steps it ran).
Seeded: the same arguments on the same device give the same weights when the steps, not the
minutes, end the phase, up to the nondeterminism of GPU kernels. Weights are saved as float16
safetensors (loading converts them to the run dtype).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.demo import captions as C  # noqa: E402
from jobs.demo.scenes import render, resolve  # noqa: E402
from jobs.demo.text import encode, tokenize  # noqa: E402

log = logging.getLogger("train_demo")
PRESET = ROOT / "conf" / "model" / "sana_tiny.yaml"


def load_preset(path: Path) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return cfg


# -- schedule ----------------------------------------------------------------------------------
def lr_at(step: int, progress: float, base: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then cosine from `base` down to `floor * base` as
    `progress` (0..1, Budget.progress) runs out."""
    ramp = min(1.0, (step + 1) / max(1, warmup))
    return base * ramp * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class Budget:
    """A phase's length: `steps`, or `minutes` of wall time, whichever runs out first.

    `progress` is the larger of the two fractions spent, so the learning rate decays to its floor
    exactly when the phase ends, however fast the machine is (the cap needs no step-time forecast,
    and a slow first step such as a compilation only shortens the phase). On a GPU the host waits
    for the device every `sync_every` steps, so the clock measures the device's work, not how far
    the host has queued ahead."""

    def __init__(self, name: str, steps: int, minutes: float, device: torch.device, sync_every: int = 50):
        self.name, self.steps, self.seconds = name, steps, minutes * 60
        self.cuda, self.sync_every = device.type == "cuda", sync_every
        self.start = time.perf_counter()

    def progress(self, step: int) -> float:
        if self.cuda and step % self.sync_every == 0:
            torch.cuda.synchronize()
        return max(step / self.steps, self.elapsed() / self.seconds)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def draw(indices: torch.Tensor, side: int, gen: torch.Generator) -> torch.Tensor:
    """Label indices -> images in [-1, 1]."""
    return render(resolve(indices, gen), side) * 2 - 1


def random_indices(n: int, device) -> torch.Tensor:
    return torch.full((n, 6), -1, dtype=torch.long, device=device)


# -- phase 1: the VAE --------------------------------------------------------------------------
def train_vae(vae, args, side: int, device, gen) -> dict:
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, betas=(0.9, 0.99), weight_decay=0.0,
                            fused=device.type == "cuda")
    budget = Budget("vae", args.vae_steps, args.vae_minutes, device)
    vae.train()
    step, losses = 0, []
    while (progress := budget.progress(step)) < 1:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, progress, args.vae_lr, warmup=min(200, args.vae_steps // 10 + 1))
        x = draw(random_indices(args.vae_batch, device), side, gen)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            z = vae.encode(x).latent
            rms = z.detach().float().pow(2).mean().sqrt()
            noise = torch.randn(z.shape, generator=gen, device=device) * rms * args.latent_noise
            noise = noise * torch.rand((z.shape[0], 1, 1, 1), generator=gen, device=device)
            x_hat = vae.decode(z + noise).sample
        err = x_hat.float() - x
        loss = err.abs().mean() + err.pow(2).mean() + 1e-4 * z.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == 1:
            losses.append(round(loss.item(), 5))
            log.info("vae step %d loss %.4f (%.0f s)", step, loss.item(), budget.elapsed())
    vae.eval()
    with torch.no_grad():
        x = draw(random_indices(256, device), side, gen)
        z = torch.cat([vae.encode(c).latent for c in x.split(64)])
        x_hat = torch.cat([vae.decode(c).sample for c in z.split(64)])
        recon = (x_hat.clamp(-1, 1) - x).abs().mean().item() * 127.5  # mean error in 0..255 levels
        scale = float(1.0 / z.float().pow(2).mean().sqrt())
    log.info("vae: %d steps in %.0f s; reconstruction error %.2f levels; scaling_factor %.5g", step,
             budget.elapsed(), recon, scale)
    return {"steps": step, "seconds": round(budget.elapsed(), 1), "recon_error_levels": round(recon, 3),
            "scaling_factor": float(f"{scale:.5g}"), "loss_per_log_every": losses}


# -- text --------------------------------------------------------------------------------------
class CaptionPool:
    """Captions embedded once up front: [N, L, D] embeddings, masks and label indices on the device."""

    def __init__(self, rows, tokenizer, text_encoder, device, kept_ids=None, chunk: int = 256):
        ids, mask = tokenize(tokenizer, [c for c, _ in rows])
        if kept_ids is not None:
            missing = set(ids[mask.bool()].unique().tolist()) - kept_ids
            assert not missing, f"caption tokens outside the slim encoder's vocabulary: {sorted(missing)[:20]}"
        embeds = [encode(text_encoder, i.to(device), m.to(device)) for i, m in zip(ids.split(chunk), mask.split(chunk))]
        self.embeds = torch.cat(embeds)
        self.mask = mask.to(device)
        self.labels = torch.tensor([lab.as_indices() for _, lab in rows], device=device)
        self.lengths = mask.sum(1)

    def __len__(self):
        return self.embeds.shape[0]


def batch_text(pools, counts, empty, p_drop: float, device, gen):
    """Rows from each pool, padded to one fixed length (the longest caption of any pool: the
    shapes never change, so the step never waits on the device to size a batch and a compiled
    step never recompiles); some captions swapped for the empty prompt. The padding is masked."""
    length = max(max(p.embeds.shape[1] for p in pools), empty[0].shape[1])
    embeds, masks, labels = [], [], []
    for p, n in zip(pools, counts):
        if not n:
            continue
        i = torch.randint(len(p), (n,), generator=gen, device=device)
        pad = length - p.embeds.shape[1]
        embeds.append(F.pad(p.embeds[i], (0, 0, 0, pad)))
        masks.append(F.pad(p.mask[i], (0, pad)))
        labels.append(p.labels[i])
    embeds, masks, labels = torch.cat(embeds), torch.cat(masks), torch.cat(labels)
    drop = torch.rand(embeds.shape[0], generator=gen, device=device) < p_drop
    e0 = F.pad(empty[0], (0, 0, 0, length - empty[0].shape[1]))
    m0 = F.pad(empty[1], (0, length - empty[1].shape[1]))
    embeds = torch.where(drop.view(-1, 1, 1), e0, embeds)
    masks = torch.where(drop.view(-1, 1), m0, masks)  # the image stays: unconditional samples
    return embeds, masks, labels


# -- phase 2: the transformer ------------------------------------------------------------------
def sample_sigmas(n: int, shift: float, device, gen) -> torch.Tensor:
    u = torch.rand(n, generator=gen, device=device).clamp(1e-4, 1 - 1e-4)
    shifted = shift * u / (1 + (shift - 1) * u)  # FlowMatchEulerDiscreteScheduler's time shift
    uniform = torch.rand(n, generator=gen, device=device) < 0.2
    return torch.where(uniform, u, shifted)


def flow_loss(model, x0, noise, sigma, embeds, masks, autocast: bool):
    """The rectified-flow loss of one batch: x_t = (1 - s) x0 + s n, target n - x0 (what the
    model's `torch.compile` fuses: the mix, the forward and the squared error)."""
    s = sigma.view(-1, 1, 1, 1)
    xt = (1 - s) * x0 + s * noise
    with torch.autocast(x0.device.type, dtype=torch.bfloat16, enabled=autocast):
        pred = model(xt, encoder_hidden_states=embeds, encoder_attention_mask=masks, timestep=sigma * 1000,
                     return_dict=False)[0]
    return (pred.float() - (noise - x0)).pow(2).mean()


def compiled_loss(enabled: bool):
    """`flow_loss`, compiled for a fixed batch shape, or as it is (compilation off or unavailable)."""
    if not enabled:
        return None
    try:
        return torch.compile(flow_loss, dynamic=False)
    except Exception as e:  # noqa: BLE001 - an older or limited torch: train eagerly
        log.warning("torch.compile unavailable (%s); training eagerly", e)
        return None


def train_dit(model, vae, pools, empty, args, side: int, shift: float, device, gen) -> tuple:
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=args.dit_lr, betas=(0.9, 0.99), weight_decay=0.0,
                            fused=device.type == "cuda")
    budget = Budget("transformer", args.dit_steps, args.dit_minutes, device)
    scale = vae.config.scaling_factor
    n_long = max(1, round(args.dit_batch * args.long_fraction)) if len(pools[1]) else 0
    counts = (args.dit_batch - n_long, n_long)
    cuda = device.type == "cuda"
    compiled = compiled_loss(args.compile == "on" or (args.compile == "auto" and cuda))
    model.train()
    step, losses, running = 0, [], torch.zeros((), device=device)
    params = list(model.parameters())
    ema_params = list(ema.parameters())
    first_seconds = None
    while (progress := budget.progress(step)) < 1:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, progress, args.dit_lr, warmup=min(args.dit_warmup, args.dit_steps // 10 + 1))
        embeds, masks, labels = batch_text(pools, counts, empty, args.cfg_drop, device, gen)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            x0 = vae.encode(draw(labels, side, gen)).latent.float() * scale
        noise = torch.randn(x0.shape, generator=gen, device=device)
        sigma = sample_sigmas(x0.shape[0], shift, device, gen)
        opt.zero_grad(set_to_none=True)
        batch = (model, x0, noise, sigma, embeds, masks, cuda)
        if compiled is not None:
            try:
                loss = compiled(*batch)
                loss.backward()
            except Exception as e:  # noqa: BLE001 - a compiler failure must not cost the run
                log.warning("compiled step failed (%s: %s); training eagerly", type(e).__name__, str(e)[:300])
                compiled = None
                opt.zero_grad(set_to_none=True)
        if compiled is None:
            loss = flow_loss(*batch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - decay)
            running += loss.detach()
        step += 1
        if step == 1:
            if cuda:
                torch.cuda.synchronize()
            first_seconds = budget.elapsed()
            log.info("transformer: first step %.1f s (%s)", first_seconds,
                     "compiled" if compiled is not None else "eager")
        if step % args.log_every == 0 or step == 1:
            avg = running.item() / (1 if step == 1 else args.log_every)
            running.zero_()
            losses.append(round(avg, 5))
            log.info("transformer step %d loss %.4f lr %.2e (%.0f s, %.0f%%)", step, avg, opt.param_groups[0]["lr"],
                     budget.elapsed(), 100 * progress)
    seconds = budget.elapsed()
    pace = (seconds - first_seconds) / max(1, step - 1) if first_seconds is not None else float("nan")
    info = {"steps": step, "seconds": round(seconds, 1), "batch": args.dit_batch, "long_rows": n_long,
            "compiled": compiled is not None, "first_step_seconds": round(first_seconds or 0.0, 1),
            "ms_per_step": round(pace * 1e3, 2), "loss_per_log_every": losses}
    log.info("transformer: %d steps in %.0f s (%.1f ms a step after the first, %s)", step, seconds, pace * 1e3,
             "compiled" if compiled is not None else "eager")
    return ema, info


# -- saving ------------------------------------------------------------------------------------
def save_half(module, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(path), metadata={k: str(v) for k, v in meta.items()})


def load_half(module, path: Path) -> None:
    from safetensors.torch import load_file

    with torch.no_grad():
        module.load_state_dict(load_file(str(path)), strict=True)


def write_preset_scale(path: Path, scale: float) -> None:
    """Rewrite the `scaling_factor:` line of the preset's vae section (comments and layout kept)."""
    text = path.read_text()
    new, n = re.subn(r"(\n      scaling_factor: )[0-9.eE+-]+", rf"\g<1>{scale:.5g}", text)
    assert n == 1, f"{path}: expected one vae scaling_factor line, found {n}"
    path.write_text(new)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", type=Path, default=PRESET)
    p.add_argument("--write-preset", action="store_true", help="write the VAE's scaling_factor into --preset")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text-encoder", default=None, help="'minilm' (the package) or a local folder; default: the preset's")
    p.add_argument("--vae-steps", type=int, default=2500)
    p.add_argument("--vae-batch", type=int, default=64)
    p.add_argument("--vae-lr", type=float, default=1e-3)
    p.add_argument("--vae-minutes", type=float, default=1.5)
    p.add_argument("--latent-noise", type=float, default=0.1, help="decoder input noise, times the latent RMS (max)")
    p.add_argument("--dit-steps", type=int, default=100_000)
    p.add_argument("--dit-batch", type=int, default=1024)
    p.add_argument("--dit-lr", type=float, default=1e-3)
    p.add_argument("--dit-minutes", type=float, default=7.0)
    p.add_argument("--dit-warmup", type=int, default=300)
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="torch.compile the transformer's training step (auto: on a GPU); a failure falls back to eager")
    p.add_argument("--resume", type=Path, default=None,
                   help="a folder this script wrote: keep its VAE, continue its transformer (EMA) weights")
    p.add_argument("--cfg-drop", type=float, default=0.1)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--pool", type=int, default=100_000, help="short training captions embedded up front")
    p.add_argument("--long-pool", type=int, default=8_000, help="captions with filler (up to 300 tokens)")
    p.add_argument("--long-fraction", type=float, default=0.125, help="rows of each batch from the long pool")
    p.add_argument("--log-every", type=int, default=200)
    p.add_argument("--side", type=int, default=0, help="image side to train at; default: the preset's sampling.height")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)

    from diffusers import AutoencoderDC, SanaTransformer2DModel

    from jobs.models import text_encoders

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    preset = load_preset(args.preset)
    tiny, side = preset["model"]["tiny"], args.side or int(preset["sampling"]["height"])
    shift = float(tiny["scheduler"]["shift"])
    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    gen = torch.Generator(device).manual_seed(args.seed + 1)
    rng = random.Random(args.seed + 2)

    # Read everything resumed from now: --out may be the same folder (it is overwritten at the end).
    before = json.loads((args.resume / "training.json").read_text()) if args.resume else None
    resumed_transformer = None
    if args.resume:
        from safetensors.torch import load_file

        resumed_transformer = load_file(str(args.resume / "transformer.safetensors"))
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes every step: pick the fastest kernels once

    # Phase 1: the VAE.
    vae_cfg = dict(tiny["vae"])
    vae = AutoencoderDC(**vae_cfg).to(device)
    if args.resume:  # the VAE as trained before, and its latent scale
        load_half(vae, args.resume / "vae.safetensors")
        vae_info = {**before["vae"], "resumed_from": str(args.resume)}
        vae.eval()
    else:
        vae_info = train_vae(vae, args, side, device, gen)
    vae_cfg["scaling_factor"] = vae_info["scaling_factor"]
    vae.register_to_config(scaling_factor=vae_info["scaling_factor"])
    vae.requires_grad_(False)

    # Text: the training captions, embedded once by the frozen encoder (full fp32, no TF32).
    name = args.text_encoder or tiny["text_encoder"]
    tokenizer = text_encoders.load_tokenizer(name)
    text_encoder = text_encoders.load_text_encoder(name, "pretrained").to(device)
    kept_file = Path(text_encoders.resolve_encoder_path(name)) / "kept_ids.json"
    kept = set(json.loads(kept_file.read_text())) if kept_file.is_file() else None
    t0 = time.perf_counter()
    short = CaptionPool(C.train_pool(rng, args.pool, p_long=0.0), tokenizer, text_encoder, device, kept)
    long_rows = [C.train_caption(rng, p_partial=0.0, p_long=1.0) for _ in range(args.long_pool)]
    long = CaptionPool(long_rows, tokenizer, text_encoder, device, kept)
    empty_ids, empty_mask = tokenize(tokenizer, [""])
    empty = (encode(text_encoder, empty_ids.to(device), empty_mask.to(device)), empty_mask.to(device))
    text_seconds = time.perf_counter() - t0
    log.info("captions: %d short (longest %d tokens), %d long (longest %d) embedded in %.0f s", len(short),
             int(short.lengths.max()), len(long), int(long.lengths.max()) if len(long) else 0, text_seconds)
    del text_encoder
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # Phase 2: the transformer.
    tr_cfg = dict(tiny["transformer"])
    model = SanaTransformer2DModel(**tr_cfg)
    if resumed_transformer is not None:
        with torch.no_grad():
            model.load_state_dict(resumed_transformer, strict=True)
    model = model.to(device)
    ema, dit_info = train_dit(model, vae, (short, long), empty, args, side, shift, device, gen)

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"seed": args.seed, "trainer": "tools/train_demo.py"}
    save_half(ema, args.out / "transformer.safetensors", meta)
    save_half(vae, args.out / "vae.safetensors", meta)
    config = {"transformer": tr_cfg, "vae": vae_cfg, "text_encoder": "minilm", "resolution": side, "shift": shift}
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    record = {
        "command": "python tools/train_demo.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "vae": vae_info,
        "text": {"short_captions": len(short), "long_captions": len(long), "seconds": round(text_seconds, 1)},
        "transformer": dit_info,
        "resumed_from": before,
        "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    if args.write_preset:
        write_preset_scale(args.preset, vae_info["scaling_factor"])
    log.info("wrote %s in %.0f s", args.out, record["total_seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
