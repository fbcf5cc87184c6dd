"""Wan's FLOPs rule: diffusers WanTransformer3DModel with its AutoencoderKLWan (tests/test_flops_wan.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops


@register_flops("wan")
def wan_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers WanTransformer3DModel (Wan 2.1 T2V 1.3B / 14B, Wan 2.2 TI2V-5B), one row, as
    WanPipeline calls it. Tokens: the latent is ((frames - 1) / VAE temporal + 1) x (H / VAE
    spatial) x (W / VAE spatial) (the VAE config's scale_factor_temporal and scale_factor_spatial,
    4 and 8 by default), cut by the Conv3d patch embedding (stride = kernel = patch_size, 1x2x2)
    into tokens. The text is the plan's bucket: the padder passes UMT5's 512 rows through and the
    transformer has no text mask, so every row is computed.

    Counted: the patch embedding (a Conv3d over the patches); the timestep embedding (sinusoid,
    then two linears to the width and the linear to 6 modulations), once per row, or once per
    latent token under Wan 2.2 TI2V's expand_timesteps; per block self-attention (q, k, v, out
    over the video tokens; softmax attention over them, rotary), cross-attention (q and out on the
    video tokens; k and v on the projected text; softmax attention over the text), the GELU
    feed-forward (up to ffn_dim, down); the output projection. Norms, rotary, modulations: not
    counted (elementwise).

    The prompt part: the text embedder (two linears, text_dim -> width -> width) and every block's
    cross-attention k and v over the text (no block updates the text).

    Rows: WanPipeline runs the negative prompt as a second call whenever guidance_scale > 1 (the
    family passes 1.0 without a negative), so 2 under CFG. expand_timesteps lives in the pipeline's
    model_index.json, which the rule does not see: it is taken to be on where the VAE is Wan 2.2's
    residual one (`is_residual`), the TI2V-5B checkpoint's pairing."""
    pt, ph, pw = (int(x) for x in get(config, "patch_size", (1, 2, 2)))
    vae = vae_config or {}
    spatial = int(get(vae, "scale_factor_spatial", 8))
    temporal = int(get(vae, "scale_factor_temporal", 4))
    f = (int(getattr(signature, "frames", 1)) - 1) // temporal + 1  # WanPipeline.prepare_latents
    h, w = int(signature.height) // spatial, int(signature.width) // spatial
    n = (f // pt) * (h // ph) * (w // pw)  # video tokens
    t = int(signature.text_bucket)
    d = int(get(config, "num_attention_heads", 40)) * int(get(config, "attention_head_dim", 128))
    ffn = int(get(config, "ffn_dim", 13824))
    layers = int(get(config, "num_layers", 40))
    c_in = int(get(config, "in_channels", 16))
    c_out = int(get(config, "out_channels", None) or c_in)
    freq = int(get(config, "freq_dim", 256))
    text_dim = int(get(config, "text_dim", 4096))
    patch = pt * ph * pw

    # expand_timesteps: one timestep a token of the latent's [:, ::2, ::2] grid (WanPipeline's loop)
    time_rows = f * -(-h // 2) * -(-w // 2) if get(vae, "is_residual", False) else 1
    time = linear(time_rows, freq, d) + linear(time_rows, d, d) + linear(time_rows, d, 6 * d)
    self_attn = 4 * linear(n, d, d) + 4.0 * n * n * d
    cross_image = 2 * linear(n, d, d) + 4.0 * n * t * d
    block_image = self_attn + cross_image + linear(n, d, ffn) + linear(n, ffn, d)
    image = linear(n, c_in * patch, d) + time + layers * block_image + linear(n, d, c_out * patch)
    prompt = linear(t, text_dim, d) + linear(t, d, d) + layers * 2 * linear(t, d, d)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)
