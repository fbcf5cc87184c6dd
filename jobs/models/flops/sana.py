"""SANA's FLOPs rule: diffusers SanaTransformer2DModel with its DC-AE (tests/test_flops.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops, vae_scale_dc


@register_flops("sana")
def sana_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers SanaTransformer2DModel (its config.json keys and defaults), one row:
    patch embed; per block ReLU linear self-attention (q, k, v, out; V'K then that times Q, with
    V padded by a row of ones), cross-attention (q, out on the latents; k, v on the projected
    caption; softmax attention over the text), GLUMBConv (1x1 up to 2x hidden, 3x3 depthwise,
    1x1 down); the timestep embedding and adaLN linears; the output projection. The caption
    projection (two linears) and the cross-attention K/V are the prompt part."""
    p = int(get(config, "patch_size", 1))
    scale = vae_scale_dc(vae_config, 32)
    n = (signature.height // scale // p) * (signature.width // scale // p)  # latent tokens
    t = int(signature.text_bucket)
    heads, head_dim = int(get(config, "num_attention_heads", 70)), int(get(config, "attention_head_dim", 32))
    d = heads * head_dim
    x_heads = int(get(config, "num_cross_attention_heads", 20))
    x_dim = x_heads * int(get(config, "cross_attention_head_dim", 112))
    kv_in = int(get(config, "cross_attention_dim", 2240))
    hidden = int(float(get(config, "mlp_ratio", 2.5)) * d)
    layers = int(get(config, "num_layers", 20))
    c_in = int(get(config, "in_channels", 32))
    c_out = int(get(config, "out_channels", None) or get(config, "in_channels", 32))
    caption = int(get(config, "caption_channels", 2304))

    self_attn = 4 * linear(n, d, d) + 4.0 * heads * (head_dim + 1) * head_dim * n
    cross_image = linear(n, d, x_dim) + linear(n, x_dim, d) + 4.0 * n * t * x_dim
    ff = linear(n, d, 2 * hidden) + 2.0 * n * 2 * hidden * 9 + linear(n, hidden, d)
    block_image = self_attn + cross_image + ff
    # Timesteps(256) -> linear -> SiLU -> linear, then adaLN-single's linear to 6 modulations.
    # With guidance_embeds a second such embedder (of the guidance scale) is added before the linear.
    embedders = 2 if get(config, "guidance_embeds", False) else 1
    time = embedders * (linear(1, 256, d) + linear(1, d, d)) + linear(1, d, 6 * d)
    image = linear(n, c_in * p * p, d) + layers * block_image + time + linear(n, d, p * p * c_out)
    prompt = linear(t, caption, d) + linear(t, d, d) + layers * 2 * linear(t, kv_in, x_dim)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)
