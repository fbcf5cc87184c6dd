"""Qwen-Image's FLOPs rule: diffusers QwenImageTransformer2DModel with its AutoencoderKLQwenImage
(tests/test_flops_qwen_image.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops


def vae_scale_qwen(vae_config: Optional[dict], default: int = 8) -> int:
    """AutoencoderKLQwenImage halves the size once per `temperal_downsample` entry: QwenImagePipeline's
    vae_scale_factor is 2 ** len(temperal_downsample) (8 for the released VAE's [False, True, True])."""
    if not vae_config or vae_config.get("temperal_downsample") is None:
        return default
    return 2 ** len(vae_config["temperal_downsample"])


@register_flops("qwen_image")
def qwen_image_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers QwenImageTransformer2DModel (its config.json keys and defaults), one row.

    Tokens: QwenImagePipeline packs 2x2 latent patches into tokens whatever the transformer's
    patch_size (in_channels = 4 x the VAE's z_dim), so an image has (H // 2s) x (W // 2s) tokens for
    the VAE's scale s (2 ** len(temperal_downsample), 8 released: 64 x 64 tokens at 1024²); the
    transformer's patch_size only sizes proj_out (p² x out_channels). The text the transformer sees
    is the plan's text bucket: the job pads prompt and negative embeddings (and mask) to it and
    passes it as max_sequence_length, and the masked padding is still computed (a boolean SDPA mask).

    The forward: img_in (a linear of the packed latents); txt_norm (RMSNorm, not counted) and txt_in
    (a linear of the Qwen2.5-VL states); the timestep embedding (sinusoid, then two linears). Each of
    the num_layers dual-stream blocks: img_mod and txt_mod (SiLU + a linear to 6 modulations, from
    the timestep embedding), the image stream's q/k/v and the text stream's add_q/k/v projections,
    joint softmax attention over [text, image] (its two products), the output linears of both
    streams (to_out, to_add_out), and a 4x GELU MLP per stream; RMSNorm of q/k and the complex
    RoPE product are elementwise. Then norm_out (AdaLayerNormContinuous: a linear to scale and
    shift) and proj_out. With zero_cond_t (the Edit-2511 variant) the timestep batch is doubled
    (t and 0): the timestep embedding and every block's img_mod run on two rows per image row.
    guidance_embeds builds nothing (this class has no guidance embedder) and
    use_additional_t_cond adds an embedding lookup, no FLOPs.

    The prompt part is txt_in alone: the text stream is modulated by the timestep and joined with the
    image in every block's attention, so nothing after it depends on the prompt alone.
    Rows: 2 under CFG (QwenImagePipeline runs the negative as a second transformer call a step
    when true_cfg_scale > 1 and negative embeddings are given, which the job does exactly for cfg).
    """
    scale = 2 * vae_scale_qwen(vae_config)  # the pipeline's vae_scale_factor, times 2 for the packing
    n = (signature.height // scale) * (signature.width // scale)  # latent tokens
    t = int(signature.text_bucket)
    s = n + t
    heads, head_dim = int(get(config, "num_attention_heads", 24)), int(get(config, "attention_head_dim", 128))
    d = heads * head_dim
    layers = int(get(config, "num_layers", 60))
    p = int(get(config, "patch_size", 2))
    c_in = int(get(config, "in_channels", 64))
    # The class default is 16; an explicit null means in_channels (`out_channels or in_channels`).
    c_out = int(config.get("out_channels", 16) or c_in)
    joint = int(get(config, "joint_attention_dim", 3584))
    t_rows = 2 if get(config, "zero_cond_t", False) else 1  # the timestep batch, per image row
    ff = 4 * d  # FeedForward's default mult

    def stream(tokens: int) -> float:  # q, k, v, the output linear and the MLP of one stream
        return 4 * linear(tokens, d, d) + linear(tokens, d, ff) + linear(tokens, ff, d)

    block = (linear(t_rows, d, 6 * d) + linear(1, d, 6 * d)  # img_mod, txt_mod
             + stream(n) + stream(t) + 4.0 * s * s * d)  # joint attention: Q K^T and weights x V
    time = linear(t_rows, 256, d) + linear(t_rows, d, d)
    image = (linear(n, c_in, d) + time + layers * block + linear(1, d, 2 * d)  # norm_out's linear
             + linear(n, d, p * p * c_out))
    prompt = linear(t, joint, d)  # txt_in
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)
