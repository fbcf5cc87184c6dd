"""LongCat-Image's FLOPs rule: diffusers LongCatImageTransformer2DModel with its AutoencoderKL
(tests/test_flops_longcat_image.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops, vae_scale_kl


@register_flops("longcat_image")
def longcat_image_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers LongCatImageTransformer2DModel (its config.json keys and defaults), one row.
    LongCatImagePipeline packs 2x2 latent patches of its 16-channel latent into tokens whatever the
    transformer's patch_size says (in_channels = 64), so an image has (H // 16) x (W // 16) tokens
    with the 8x VAE; the text is what the pipeline hands over, always padded to 512 positions (no text
    mask: every position is attended), which is the plan's text bucket.
    The forward: x_embedder (a linear of the packed latents), the timestep embedding (Timesteps(256)
    -> linear -> SiLU -> linear; no guidance or pooled-text embedder, `guidance` is ignored), the
    context embedder (a linear of the text), rotary position embeddings (elementwise, not counted).
    Double blocks: adaLN-zero linears (to 6 modulations) of the image and text streams, q/k/v of each
    stream, joint softmax attention over text + image, the image output and text output linears,
    the two 4x GELU MLPs. Single blocks over the joined sequence: adaLN (to 3 modulations), q/k/v,
    the 4x MLP up, one output linear over attention and MLP together. Then adaLN-continuous's linear
    (to 2 modulations) and the output projection (patch_size^2 x in_channels wide) of the image tokens.
    The prompt part: the context embedder alone (every double block updates the text stream, so no
    later text work depends on the prompt alone).
    Rows: LongCatImagePipeline runs CFG (guidance_scale > 1, the plan's cfg) as a second transformer
    call on the negative embeddings (also 512 positions), so 2 rows with CFG, 1 without."""
    scale = 2 * vae_scale_kl(vae_config, 8)  # the pipeline's vae_scale_factor, times the 2x2 packing
    n = (signature.height // scale) * (signature.width // scale)  # image tokens
    t = int(signature.text_bucket)
    s = n + t
    d = int(get(config, "num_attention_heads", 24)) * int(get(config, "attention_head_dim", 128))
    p = int(get(config, "patch_size", 1))
    c_in = int(get(config, "in_channels", 64))  # out_channels = in_channels in this class
    ff = 4 * d  # FeedForward's default mult and the single blocks' mlp_ratio

    def attention(tokens: int) -> float:
        return 4.0 * tokens * tokens * d  # Q K^T and (softmax) V, 2 FLOPs a multiply-add each

    double = (2 * linear(1, d, 6 * d) + 4 * linear(n, d, d) + 4 * linear(t, d, d) + attention(s)
              + linear(n, d, ff) + linear(n, ff, d) + linear(t, d, ff) + linear(t, ff, d))
    single = linear(1, d, 3 * d) + 3 * linear(s, d, d) + attention(s) + linear(s, d, ff) + linear(s, d + ff, d)
    time = linear(1, 256, d) + linear(1, d, d)
    image = (linear(n, c_in, d) + time + int(get(config, "num_layers", 19)) * double
             + int(get(config, "num_single_layers", 38)) * single + linear(1, d, 2 * d)
             + linear(n, d, p * p * c_in))
    prompt = linear(t, int(get(config, "joint_attention_dim", 3584)), d)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)
