"""Model FLOPs of a family's transformer per image, counted from its config and the plan's signature.

    flops = transformer_flops("sana", transformer_config, vae_config, signature)   # None: not counted
    flops_summary("sana", signature, images=510, seconds=167.7,
                  transformer_config=..., vae_config=...)   # {"tflops": ..., "peak_fraction": ...}
    flops_summary_mix("sana", {sig_a: 452, sig_b: 58}, 167.7, transformer_config=..., vae_config=...)

What is counted is what `torch.utils.flop_counter.FlopCounterMode` counts: matmuls (2 FLOPs per
multiply-add), convolutions and attention's two products; elementwise ops, norms and softmax are
not (they are memory-bound and a few percent of the FLOPs). tests/test_flops.py checks each rule
against the counter on a tiny real diffusers model. The count is the model's work: an engine that
skips work (bcgen's prompt memo makes SANA's caption projection and cross-attention K/V once per
prompt batch, not once per step) does fewer FLOPs for the same image, and its achieved TFLOP/s is
stated against the model's count, as MFU is.

Families register a rule by name; an unknown name gives None, which callers report as "not
counted". Peak: H200 dense bf16, 989 TFLOP/s (datasheet; about 790 measured on a large GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

H200_BF16_DENSE_TFLOPS = 989.0


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one transformer forward for one image row (one CFG branch), split by what depends
    on the prompt alone (made once per prompt by an engine that memoizes it) and what does not."""

    per_forward_image: float  # every step: the latent path
    per_forward_prompt: float  # every step in the model, once per prompt with a prompt memo
    steps: int
    rows: int  # transformer rows per image and step: 2 with classifier-free guidance

    @property
    def per_forward(self) -> float:
        return self.per_forward_image + self.per_forward_prompt

    @property
    def per_image(self) -> float:
        """The model's FLOPs for one image: every step, every CFG branch."""
        return self.steps * self.rows * self.per_forward

    @property
    def per_image_with_prompt_memo(self) -> float:
        """What an engine that makes the prompt part once per image computes."""
        return self.rows * (self.steps * self.per_forward_image + self.per_forward_prompt)


Rule = Callable[[dict, Optional[dict], object], FlopCount]
_RULES: Dict[str, Rule] = {}


def register_flops(family: str):
    def wrap(rule: Rule) -> Rule:
        if family in _RULES:
            raise ValueError(f"a FLOPs rule for {family!r} is registered already")
        _RULES[family] = rule
        return rule

    return wrap


def known_families() -> list:
    return sorted(_RULES)


def transformer_flops(
    family: str, transformer_config: dict, vae_config: Optional[dict], signature
) -> Optional[FlopCount]:
    """The family's count for `signature` (jobs.plan.Signature: height, width, text_bucket, steps,
    cfg), or None where the family has no rule."""
    rule = _RULES.get(family)
    return None if rule is None else rule(transformer_config, vae_config, signature)


# Dense bf16 TFLOP/s by the GPU's name (datasheets): where the name is not here, no fraction is claimed.
DENSE_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "B200": 2250.0}


def dense_bf16_peak(device) -> Optional[float]:
    """The datasheet dense bf16 peak of `device`'s GPU, or None (a CPU, or a GPU not in the table)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in DENSE_BF16_TFLOPS.items() if k in name), None)


def flops_summary(family: str, signature, images: int, seconds: float, *, transformer_config: dict,
                  vae_config: Optional[dict] = None, peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """What a summary reports: model FLOPs per image, achieved TFLOP/s over `seconds` for `images`
    images of `signature`, and the fraction of the peak; {"counted": False, ...} without a rule."""
    return flops_summary_mix(family, {signature: images}, seconds, transformer_config=transformer_config,
                             vae_config=vae_config, peak_tflops=peak_tflops)


def flops_summary_mix(family: str, images_by_signature: dict, seconds: float, *, transformer_config: dict,
                      vae_config: Optional[dict] = None, peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """flops_summary of a run of several signatures ({Signature: images}) in `seconds` (a job's
    generation stage): FLOPs per image is the run's mean."""
    found = {sig: transformer_flops(family, transformer_config, vae_config, sig) for sig in images_by_signature}
    counts = {sig: c for sig, c in found.items() if c is not None}
    if not found or len(counts) < len(found):
        return {"counted": False, "reason": f"not counted: no FLOPs rule for family {family!r} "
                                            f"(known: {', '.join(known_families())})"}
    images = sum(images_by_signature.values())
    total = sum(c.per_image * images_by_signature[sig] for sig, c in counts.items())
    memo = sum(c.per_image_with_prompt_memo * images_by_signature[sig] for sig, c in counts.items())
    tflops = total / seconds / 1e12 if seconds > 0 and images else None
    return {"counted": True, "flops_per_image": total / images if images else None,
            "flops_per_image_with_prompt_memo": memo / images if images else None,
            "tflops": None if tflops is None else round(tflops, 2), "peak_tflops": peak_tflops,
            "peak_fraction": None if tflops is None else round(tflops / peak_tflops, 4)}


def _linear(tokens: int, fan_in: int, fan_out: int) -> float:
    return 2.0 * tokens * fan_in * fan_out


def _vae_scale(vae_config: Optional[dict], default: int) -> int:
    """Pixels per latent side: 2 ** (stages - 1) for an encoder that halves at each stage but the first."""
    if not vae_config or "encoder_block_out_channels" not in vae_config:
        return default
    return 2 ** (len(vae_config["encoder_block_out_channels"]) - 1)


def _get(config: dict, name: str, default):
    value = config.get(name)
    return default if value is None else value


@register_flops("sana")
def sana_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers SanaTransformer2DModel (its config.json keys and defaults), one row:
    patch embed; per block ReLU linear self-attention (q, k, v, out; V'K then that times Q, with
    V padded by a row of ones), cross-attention (q, out on the latents; k, v on the projected
    caption; softmax attention over the text), GLUMBConv (1x1 up to 2x hidden, 3x3 depthwise,
    1x1 down); the timestep embedding and adaLN linears; the output projection. The caption
    projection (two linears) and the cross-attention K/V are the prompt part."""
    p = int(_get(config, "patch_size", 1))
    scale = _vae_scale(vae_config, 32)
    n = (signature.height // scale // p) * (signature.width // scale // p)  # latent tokens
    t = int(signature.text_bucket)
    heads, head_dim = int(_get(config, "num_attention_heads", 70)), int(_get(config, "attention_head_dim", 32))
    d = heads * head_dim
    x_heads = int(_get(config, "num_cross_attention_heads", 20))
    x_dim = x_heads * int(_get(config, "cross_attention_head_dim", 112))
    kv_in = int(_get(config, "cross_attention_dim", 2240))
    hidden = int(float(_get(config, "mlp_ratio", 2.5)) * d)
    layers = int(_get(config, "num_layers", 20))
    c_in = int(_get(config, "in_channels", 32))
    c_out = int(_get(config, "out_channels", None) or _get(config, "in_channels", 32))
    caption = int(_get(config, "caption_channels", 2304))

    self_attn = 4 * _linear(n, d, d) + 4.0 * heads * (head_dim + 1) * head_dim * n
    cross_image = _linear(n, d, x_dim) + _linear(n, x_dim, d) + 4.0 * n * t * x_dim
    ff = _linear(n, d, 2 * hidden) + 2.0 * n * 2 * hidden * 9 + _linear(n, hidden, d)
    block_image = self_attn + cross_image + ff
    # Timesteps(256) -> linear -> SiLU -> linear, then adaLN-single's linear to 6 modulations.
    # With guidance_embeds a second such embedder (of the guidance scale) is added before the linear.
    embedders = 2 if _get(config, "guidance_embeds", False) else 1
    time = embedders * (_linear(1, 256, d) + _linear(1, d, d)) + _linear(1, d, 6 * d)
    image = _linear(n, c_in * p * p, d) + layers * block_image + time + _linear(n, d, p * p * c_out)
    prompt = _linear(t, caption, d) + _linear(t, d, d) + layers * 2 * _linear(t, kv_in, x_dim)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)


@register_flops("flux")
def flux_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers FluxTransformer2DModel, one row (Flux.1-dev is guidance-distilled: no CFG rows).
    FluxPipeline packs 2x2 latent patches into tokens (in_channels = 4 x the VAE's channels), so an
    image has (H / 16) x (W / 16) tokens with the 8x VAE. Double blocks: adaLN-zero linears of the
    image and text streams, their q/k/v and outputs, joint softmax attention over text + image,
    the two 4x GELU MLPs; single blocks over the joined sequence: adaLN, q/k/v, the 4x MLP, one
    output linear over attention and MLP together. The prompt part: the context embedder and the
    pooled text projection (the text stream is updated by every block, so nothing else is)."""
    scale = 2 * _vae_scale_kl(vae_config, 8)  # 2x2 packing on top of the VAE
    p = int(_get(config, "patch_size", 1))
    n = (signature.height // scale // p) * (signature.width // scale // p)
    t = int(signature.text_bucket)
    s = n + t
    d = int(_get(config, "num_attention_heads", 24)) * int(_get(config, "attention_head_dim", 128))
    c_in = int(_get(config, "in_channels", 64))
    c_out = int(_get(config, "out_channels", None) or c_in)
    ff = 4 * d  # FeedForward's default mult and the single blocks' mlp_ratio

    def attention(tokens: int) -> float:
        return 4.0 * tokens * tokens * d

    double = (2 * _linear(1, d, 6 * d) + 4 * _linear(n, d, d) + 4 * _linear(t, d, d) + attention(s)
              + _linear(n, d, ff) + _linear(n, ff, d) + _linear(t, d, ff) + _linear(t, ff, d))
    single = _linear(1, d, 3 * d) + 3 * _linear(s, d, d) + attention(s) + _linear(s, d, ff) + _linear(s, d + ff, d)
    embedders = 2 if _get(config, "guidance_embeds", False) else 1
    time = embedders * (_linear(1, 256, d) + _linear(1, d, d))
    image = (_linear(n, c_in, d) + time + int(_get(config, "num_layers", 19)) * double
             + int(_get(config, "num_single_layers", 38)) * single + _linear(1, d, 2 * d)
             + _linear(n, d, p * p * c_out))
    pooled = int(_get(config, "pooled_projection_dim", 768))
    prompt = _linear(t, int(_get(config, "joint_attention_dim", 4096)), d) + _linear(1, pooled, d) + _linear(1, d, d)
    # One row whatever signature.cfg says: the plan marks guidance > 1 as CFG, but FluxPipeline runs
    # Flux.1-dev's guidance as an embedding (true_cfg_scale=1: no negative branch, jobs/models/flux.py).
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps), rows=1)


def _vae_scale_kl(vae_config: Optional[dict], default: int) -> int:
    """AutoencoderKL: it halves the size at every block but the last."""
    if not vae_config or "block_out_channels" not in vae_config:
        return default
    return 2 ** (len(vae_config["block_out_channels"]) - 1)
