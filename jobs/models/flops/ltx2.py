"""LTX-2's FLOPs rule: diffusers LTX2VideoTransformer3DModel (video and sound in one forward) as
LTX2Pipeline calls it through jobs/models/ltx2.py (tests/test_flops_ltx2.py)."""

from __future__ import annotations

from typing import Optional, Tuple

from jobs.models.flops.base import FlopCount, get, linear, register_flops

# LTX2Pipeline.__call__'s defaults, which the family leaves as they are under guidance
# (jobs/models/ltx2.py pipeline_kwargs; tests/test_flops_ltx2.py pins them to the pipeline).
STG_BLOCKS = (28,)  # spatio_temporal_guidance_blocks
FPS = 24.0  # frame_rate: the presets' sampling.fps. The signature does not carry the rate, and the
# audio length follows the clip's duration, so a job at another fps has other audio token counts.


def _emb(dim: int) -> float:
    """PixArtAlphaCombinedTimestepSizeEmbeddings of one timestep: 256 sinusoids -> linear -> SiLU -> linear."""
    return linear(1, 256, dim) + linear(1, dim, dim)


def ltx2_forward(config: dict, vae_config: Optional[dict], signature, *, stg: bool = False,
                 isolate: bool = False) -> Tuple[float, float]:
    """(latent part, prompt part) of one row of one LTX2VideoTransformer3DModel call: the plain call
    (CFG's pair), `stg` the spatio-temporal guidance call, `isolate` the modality-isolation call."""
    if vae_config:
        from jobs.models.ltx2 import vae_ratios  # the family's reading of the VAE's class rule

        spatial, temporal = vae_ratios(vae_config)
    else:
        spatial, temporal = 32, 8  # the released VAE (and LTX2Pipeline's fallbacks)
    p, pt = int(get(config, "patch_size", 1)), int(get(config, "patch_size_t", 1))
    # LTX2Pipeline.prepare_latents + _pack_latents: (F - 1) // temporal + 1 latent frames, patched.
    frames = (signature.frames - 1) // temporal + 1
    n = frames // pt * (signature.height // spatial // p) * (signature.width // spatial // p)
    # The audio latents: one token per latent frame (all mel bins packed into the channels), as many
    # as the clip's duration makes: round(frames / fps * rate / hop / 4), the pipeline's own arithmetic.
    # The transformer's audio_sampling_rate / hop / scale are its audio VAE's (its audio RoPE uses them).
    per_second = (int(get(config, "audio_sampling_rate", 16000)) / int(get(config, "audio_hop_length", 160))
                  / float(get(config, "audio_scale_factor", 4)))
    m = round(signature.frames / FPS * per_second)
    t = int(signature.text_bucket)  # the connectors keep the length: the padded max_sequence_length

    heads, audio_heads = int(get(config, "num_attention_heads", 32)), int(get(config, "audio_num_attention_heads", 32))
    d = heads * int(get(config, "attention_head_dim", 128))
    a = audio_heads * int(get(config, "audio_attention_head_dim", 64))
    kv_in = int(get(config, "cross_attention_dim", 4096))
    audio_kv_in = int(get(config, "audio_cross_attention_dim", 2048))
    c_in, a_in = int(get(config, "in_channels", 128)), int(get(config, "audio_in_channels", 128))
    c_out = int(get(config, "out_channels", None) or c_in)
    a_out = int(get(config, "audio_out_channels", None) or a_in)
    layers = int(get(config, "num_layers", 48))
    caption = int(get(config, "caption_channels", 3840))
    video_gate, audio_gate = bool(get(config, "gated_attn", False)), bool(get(config, "audio_gated_attn", False))
    video_mod, audio_mod = bool(get(config, "cross_attn_mod", False)), bool(get(config, "audio_cross_attn_mod", False))
    prompt_adaln = (video_mod or audio_mod) and bool(get(config, "use_prompt_adaln_single", True))
    gated_ff = str(get(config, "activation_fn", "gelu-approximate")) in ("geglu", "swiglu")  # up-projection 2x

    def attention(q: int, kv: int, inner: int) -> float:  # QK^T and (softmax) V, every head
        return 4.0 * q * kv * inner

    def ff(tokens: int, dim: int) -> float:  # FeedForward, 4x
        return linear(tokens, dim, (8 if gated_ff else 4) * dim) + linear(tokens, 4 * dim, dim)

    # Per block, self-attention of each stream (q, k, v, out, attention; the per-head gate logits).
    video_self = 4 * linear(n, d, d) + attention(n, n, d) + video_gate * linear(n, d, heads)
    audio_self = 4 * linear(m, a, a) + attention(m, m, a) + audio_gate * linear(m, a, audio_heads)
    # Text cross-attention: q, out and attention on the latents; k, v on the text.
    text_kv = 2 * linear(t, kv_in, d) + 2 * linear(t, audio_kv_in, a)
    text = (2 * linear(n, d, d) + attention(n, t, d) + video_gate * linear(n, d, heads)
            + 2 * linear(m, a, a) + attention(m, t, a) + audio_gate * linear(m, a, audio_heads))
    # Audio-to-video (q: video, k/v: audio) and video-to-audio (q: audio, k/v: video), both a wide.
    a2v = (linear(n, d, a) + 2 * linear(m, a, a) + linear(n, a, d) + attention(n, m, a)
           + video_gate * linear(n, d, audio_heads))
    v2a = (linear(m, a, a) + 2 * linear(n, d, a) + linear(m, a, a) + attention(m, n, a)
           + audio_gate * linear(m, a, audio_heads))
    block = video_self + audio_self + text + (0.0 if isolate else a2v + v2a) + ff(n, d) + ff(m, a)
    if stg and bool(get(config, "perturbed_attn", False)):
        # LTX2PerturbedAttnProcessor at the STG blocks: self-attention is its values (no q, k, attention).
        skipped = 2 * linear(n, d, d) + attention(n, n, d) + 2 * linear(m, a, a) + attention(m, m, a)
        stg_layers = sum(1 for i in STG_BLOCKS if i < layers)
    else:  # the default processor ignores the STG blocks: the call does the full work
        skipped, stg_layers = 0.0, 0

    # Timestep embeddings and their adaLN linears (one row each): video (6 or 9 modulations), audio,
    # the a2v/v2a scale-shift (4) and gate (1) of each stream, and with cross-attention modulation
    # under use_prompt_adaln_single the prompt's K/V modulation of each stream (2).
    time = (_emb(d) + linear(1, d, (9 if video_mod else 6) * d) + _emb(a) + linear(1, a, (9 if audio_mod else 6) * a)
            + _emb(d) + linear(1, d, 4 * d) + _emb(d) + linear(1, d, d)
            + _emb(a) + linear(1, a, 4 * a) + _emb(a) + linear(1, a, a))
    if prompt_adaln:
        time += _emb(d) + linear(1, d, 2 * d) + _emb(a) + linear(1, a, 2 * a)
    captions = 0.0
    if get(config, "use_prompt_embeddings", True):  # LTX-2.0: PixArt caption projections of each stream
        captions = linear(t, caption, d) + linear(t, d, d) + linear(t, caption, a) + linear(t, a, a)
    image = (linear(n, c_in, d) + linear(m, a_in, a) + time + layers * block - stg_layers * skipped
             + linear(n, d, c_out) + linear(m, a, a_out))
    # The text K/V depend on the prompt alone unless a timestep-dependent modulation (LTX-2.3's
    # prompt adaLN) scales the text first.
    if prompt_adaln:
        return image + layers * text_kv, captions
    return image, captions + layers * text_kv


@register_flops("ltx2")
def ltx2_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers LTX2VideoTransformer3DModel, one row: video tokens from the frames and the size
    through the VAE's (spatial, temporal) compression (32, 8 as released) and the patch sizes; audio
    tokens, one per latent audio frame, from the clip's duration at 24 fps; the text at the bucket
    (1024: the connectors keep the padded length, every position attended). proj_in of each stream;
    the timestep embeddings and adaLN linears; per block, for video and for audio: self-attention
    (q, k, v, out, softmax attention), text cross-attention (q, out on the latents, k, v on the
    text), the audio-to-video and video-to-audio cross-attention (q from one stream, k, v from the
    other, audio-wide), the 4x GELU MLP (and the per-head gate logits where gated attention is on);
    proj_out of each stream. The prompt part: the two caption projections and every block's text
    K/V (which move to the latent part where LTX-2.3's timestep-dependent prompt adaLN modulates
    the text before them).

    Rows: LTX2Pipeline's guidance recipe, which the job runs whenever it has a negative branch: one
    call on the CFG batch [negative, positive] (2 rows), a spatio-temporal guidance call (block 28's
    self-attention replaced by its values where the checkpoint has perturbed_attn; the full work
    otherwise) and a modality-isolation call (no a2v / v2a attention), 1 row each: 4 rows a step,
    `per_forward_image` their mean, so `per_image` is exactly the four calls. Without guidance, one."""
    full, prompt = ltx2_forward(config, vae_config, signature)
    if not signature.cfg:
        return FlopCount(per_forward_image=full, per_forward_prompt=prompt, steps=int(signature.steps), rows=1)
    stg, _ = ltx2_forward(config, vae_config, signature, stg=True)
    isolated, _ = ltx2_forward(config, vae_config, signature, isolate=True)
    return FlopCount(per_forward_image=(2 * full + stg + isolated) / 4, per_forward_prompt=prompt,
                     steps=int(signature.steps), rows=4)
