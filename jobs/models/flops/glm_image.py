"""GLM-Image's FLOPs rule: diffusers GlmImageTransformer2DModel (the DiT) with its AutoencoderKL
(tests/test_flops_glm_image.py). The autoregressive prior that makes the DiT's prior tokens is not
counted: it runs once per prompt in the encode stage, outside the transformer (jobs/models/glm_image.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops, vae_scale_kl

# The unconditional branch's glyph text: GlmImagePipeline encodes "" (ByT5: its one eos token; one span,
# so no parity pad) whatever the job's negative prompt, so that row's DiT sees 1 text row.
NEGATIVE_GLYPH_ROWS = 1


@register_flops("glm_image")
def glm_image_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers GlmImageTransformer2DModel (its config.json keys and defaults), as GlmImagePipeline
    calls it for text-to-image.

    Tokens: latents of H / s x W / s for the VAE's scale s (the pipeline's vae_scale_factor,
    2 ** (len(block_out_channels) - 1): 8 released), cut into patch_size² patches: n image tokens
    (64 x 64 at 1024² with patch 2). The prior tokens (the AR's 1/32 grid, upsampled 2x) are one per
    image token (the forward adds them). The text is the prompt's glyph embeddings at their native
    length t (the plan's text_bucket, nothing padded: padding/glm_image.py), no mask.

    The forward: image_projector (a linear of the patches); glyph_projector (a 2-linear GELU MLP,
    text_embed_dim -> d -> d, over the t glyph rows); the prior token embedding (a lookup) and
    prior_projector (a 2-linear SiLU MLP, d -> d -> d, over the n prior tokens); the timestep MLP
    (time_embed_dim -> E -> E) and the size/crop condition MLP (4 condition_dim -> E -> E). Each of
    num_layers blocks: its adaLN-zero linear (E -> 12 d, for the image and text streams together);
    q/k/v and out linears over the joined text + image sequence (s = t + n), softmax attention
    over it (Q K^T and weights x V); the 4x GELU feed-forward over both streams (one module, run on
    each). Then norm_out's linear (E -> 2 d) and proj_out (d -> p² out_channels). LayerNorms, the
    q/k LayerNorm and RoPE are elementwise.

    The prompt part: glyph_projector and prior_projector, fixed over the steps (the glyph rows depend
    on the prompt; the prior tokens on the prompt and the row's seed, so a memo makes them once per
    image). The text stream is modulated by the timestep and joined with the image in every block,
    so nothing after them qualifies.

    Rows: 2 under CFG (guidance > 1): GlmImagePipeline runs the unconditional branch as a second call
    a step, with the prior tokens dropped (zeroed after the lookup: prior_projector still runs) and
    the glyph text of "" (NEGATIVE_GLYPH_ROWS), not the positive's t rows. The two rows differ only by
    their text length, so a row's count under CFG is the mean of the two calls: rows x per_forward
    is exactly what a step runs."""
    p = int(get(config, "patch_size", 2))
    scale = vae_scale_kl(vae_config, 8)
    n = (signature.height // scale // p) * (signature.width // scale // p)  # image tokens = prior tokens
    d = int(get(config, "num_attention_heads", 64)) * int(get(config, "attention_head_dim", 40))
    layers = int(get(config, "num_layers", 30))
    c_in = int(get(config, "in_channels", 16))
    c_out = int(get(config, "out_channels", 16))
    glyph = int(get(config, "text_embed_dim", 1472))
    e = int(get(config, "time_embed_dim", 512))
    cond = int(get(config, "condition_dim", 256))
    ff = 4 * d  # FeedForward's default mult

    def image_part(t: int) -> float:
        s = t + n
        block = (linear(1, e, 12 * d) + 4 * linear(s, d, d) + 4.0 * s * s * d
                 + linear(s, d, ff) + linear(s, ff, d))
        embed = linear(1, e, e) + linear(1, e, e) + linear(1, 4 * cond, e) + linear(1, e, e)
        return (linear(n, c_in * p * p, d) + embed + layers * block + linear(1, e, 2 * d)
                + linear(n, d, p * p * c_out))

    def prompt_part(t: int) -> float:
        return linear(t, glyph, d) + linear(t, d, d) + 2 * linear(n, d, d)

    t = int(signature.text_bucket)
    if signature.cfg:
        image = (image_part(t) + image_part(NEGATIVE_GLYPH_ROWS)) / 2
        prompt = (prompt_part(t) + prompt_part(NEGATIVE_GLYPH_ROWS)) / 2
    else:
        image, prompt = image_part(t), prompt_part(t)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)
