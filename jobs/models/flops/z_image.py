"""Z-Image's FLOPs rule: diffusers ZImageTransformer2DModel with its AutoencoderKL (tests/test_flops_z_image.py)."""

from __future__ import annotations

from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops, vae_scale_kl

SEQ_MULTI_OF = 32  # the transformer pads the caption and the image tokens each to a multiple of this
ADALN_EMBED_DIM = 256  # the timestep embedding's width is min(dim, this)
T_MID = 1024  # TimestepEmbedder's hidden width (fixed in the class)
PATCH, F_PATCH = 2, 1  # forward()'s defaults: ZImagePipeline never passes patch_size / f_patch_size


def _padded(tokens: int) -> int:
    return tokens + (-tokens) % SEQ_MULTI_OF


@register_flops("z_image")
def z_image_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers ZImageTransformer2DModel (its config.json keys and defaults), one row, as
    ZImagePipeline calls it: a list of latents [C, 1, H/8, W/8] (patch 2, frame patch 1: forward's
    defaults, the only ones the pipeline uses), so (H / 16) x (W / 16) image tokens with the 8x VAE,
    and a list of captions at their native length L. The transformer pads the image tokens and the
    caption each to a multiple of 32 (pad rows are computed like the others) and, in a batch, to
    the batch's longest: with the plan's text_bucket = max(positive, negative) length, every row
    carries ceil(L / 32) x 32 caption tokens.

    Counted: the timestep MLP (256 -> 1024 -> min(dim, 256)); the patch embedder over the image
    tokens; the noise refiner (n_refiner_layers blocks over the image tokens); the caption embedder
    (RMSNorm then a linear from cap_feat_dim) and the context refiner (n_refiner_layers blocks over
    the caption, without modulation); n_layers blocks over the joined image + caption sequence; the
    final layer (its adaLN linear and the output projection, over the whole joined sequence). A
    block: its adaLN linear (min(dim, 256) -> 4 dim) where it modulates, q/k/v/out projections
    (n_kv_heads is not used by the class: k and v are full width), softmax attention (QK^T and
    attention x V), and the SwiGLU feed-forward (w1, w3 up to int(dim / 3 * 8), w2 down).

    The prompt part: the caption embedder and the context refiner, which depend on the caption
    alone (no timestep modulation). Under CFG ZImagePipeline batches the negative with the positive
    in one call (rows = 2); guidance 0 (the job's no-CFG value, Z-Image-Turbo) runs one row."""
    c = int(get(config, "in_channels", 16))
    d = int(get(config, "dim", 3840))
    heads = int(get(config, "n_heads", 30))
    inner = (d // heads) * heads  # Attention's width: heads x (dim // heads)
    hidden = int(d / 3 * 8)  # FeedForward's width, as the block computes it
    layers = int(get(config, "n_layers", 30))
    refiners = int(get(config, "n_refiner_layers", 2))
    cap = int(get(config, "cap_feat_dim", 2560))
    adaln = min(d, ADALN_EMBED_DIM)

    # prepare_latents: 2 * (H // (2 * vae)) latent rows, then 2x2 patches; one frame.
    vae = vae_scale_kl(vae_config, 8)
    lat_h, lat_w = 2 * (signature.height // (2 * vae)), 2 * (signature.width // (2 * vae))
    n = _padded((lat_h // PATCH) * (lat_w // PATCH))  # image tokens, padded to 32
    t = _padded(int(signature.text_bucket))  # caption tokens, padded to 32
    s = n + t  # the joined sequence of the main layers

    def block(tokens: int, modulated: bool) -> float:
        return ((linear(1, adaln, 4 * d) if modulated else 0.0) + 3 * linear(tokens, d, inner)
                + linear(tokens, inner, d) + 4.0 * tokens * tokens * inner + 3 * linear(tokens, d, hidden))

    patch_dim = F_PATCH * PATCH * PATCH * c
    time = linear(1, 256, T_MID) + linear(1, T_MID, adaln)
    image = (time + linear(n, patch_dim, d) + refiners * block(n, True) + layers * block(s, True)
             + linear(1, adaln, d) + linear(s, d, patch_dim))
    prompt = linear(t, cap, d) + refiners * block(t, False)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=int(signature.steps),
                     rows=2 if signature.cfg else 1)
