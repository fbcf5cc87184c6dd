"""MiniMax-H3's FLOPs rule: diffusers MiniMaxH3Transformer3DModel (t2va) with its AutoencoderKLMiniMaxH3
(tests/test_flops_minimax_h3.py)."""

from __future__ import annotations

import math
from typing import Optional

from jobs.models.flops.base import FlopCount, get, linear, register_flops

FPS = 24  # MINIMAX_H3_FPS: the audio length follows the clip's duration at this rate
AUDIO_LATENTS_PER_SECOND = 40  # the audio VAE's 800-sample hop at 32 kHz (MINIMAX_H3_AUDIO_LATENTS_PER_SECOND)
AUDIO_CHANNELS = 2  # stereo, packed channel-major (MINIMAX_H3_AUDIO_CHANNELS)
MODALITIES = 3  # one AdaLN modulation set per (timestep, modality): video, text, audio


def tokens(config: dict, vae_config: Optional[dict], signature) -> tuple:
    """(video, audio, text) rows of the packed sequence, as MiniMaxH3PrepareLayoutStep lays out a t2va request:
    the video VAE's latent frames (its 17-frame chunks kept as 5 latents, plus 2) by (H / 16) x (W / 16), cut
    into (1, 2, 2) patches (the layout takes a time patch of 1 only, the release's); round(frames / 24 fps x 40)
    audio latents per channel, two channels; the prompt at its own length (the padder never pads it:
    padding/minimax_h3.py)."""
    vae = vae_config or {}
    pt, ph, pw = (int(x) for x in get(config, "patch_size", (1, 2, 2)))
    spatial = math.prod(get(vae, "spatial_downsample_factors", (2, 2, 2, 2, 1, 1)))
    temporal = math.prod(get(vae, "temporal_downsample_factors", (1, 2, 2, 1, 1, 1)))
    chunk = int(get(vae, "clip_length", 17))
    kept = math.ceil(chunk / temporal)  # the VAE's tokens_chunk_size
    frames = int(getattr(signature, "frames", 1))
    latent_frames = (frames - kept) // chunk * kept + 2  # video_latent_num_frames
    h, w = int(signature.height) // spatial, int(signature.width) // spatial
    video = (latent_frames // pt) * (h // ph) * (w // pw)
    audio = int(round(frames / FPS * AUDIO_LATENTS_PER_SECOND)) * AUDIO_CHANNELS  # audio_latent_num_frames
    return video, audio, int(signature.text_bucket)


def timestep_flops(config: dict, timesteps: int) -> float:
    """One call's timestep part for `timesteps` distinct noise levels: the timestep MLP, every block's AdaLN
    projection and norm_out's. It runs on the distinct timesteps, not on the rows: a batch of B rows shares it."""
    d = int(get(config, "hidden_size", 5376))
    freq = int(get(config, "freq_dim", 256))
    hidden = int(get(config, "time_embed_hidden_dim", 5376))
    embed = int(get(config, "time_embed_dim", 2688))
    layers = int(get(config, "num_layers", 50))
    return (linear(timesteps, freq, hidden) + linear(timesteps, hidden, embed)
            + layers * linear(timesteps, embed, 6 * MODALITIES * d) + linear(timesteps, embed, 2 * d))


def timesteps_per_call(steps: int) -> list:
    """The distinct timesteps of each transformer call of a `steps`-point schedule: steps - 1 calls (the terminal
    sigma has none); both schedules start at t = 0 (one level), then video (shift 12) and audio (shift 3) differ."""
    return [1 if i == 0 else 2 for i in range(max(int(steps) - 1, 0))]


@register_flops("minimax_h3")
def minimax_h3_flops(config: dict, vae_config: Optional[dict], signature) -> FlopCount:
    """diffusers MiniMaxH3Transformer3DModel, one row, as the family's denoise calls it (one call a step on one
    packed sequence [text | audio | video], no CFG: the checkpoint is guidance-distilled, no negative prompt).

    Forward: the video patch projection (in_channels x 1x2x2 -> width), the audio projection, the context
    embedder (text_dim -> width) and the token refiner over the text alone (num_refiner_layers plain blocks:
    q, k, v, out, softmax attention over the text, the SwiGLU feed-forward: up to 2 x ffn_dim, down); the
    timestep MLP (sinusoid, two linears) on the call's distinct timesteps; per block, over the whole packed
    sequence S = text + audio + video: the AdaLN projection (time_embed_dim -> 6 x 3 modalities x width, on the
    distinct timesteps), q, k, v (width -> heads x head_dim, wider than the width) and out, softmax attention
    over S (rotary), the SwiGLU feed-forward; norm_out's projection (on the timesteps); both output heads over
    every row of S (the video and audio rows are selected after). Norms, rotary, modulation: not counted.

    The prompt part: the context embedder and the token refiner (the text before it joins the sequence; every
    block then updates it with the media, so nothing after is prompt-only).

    Steps: MiniMaxH3Scheduler's `steps` grid points hold the terminal 0, so a clip is steps - 1 calls. The
    timestep part runs on 1 distinct timestep at the first call and 2 after (video and audio at their own
    levels): per_forward_image carries its mean over the calls, so per_image is the clip's total. Rows: 1.
    The timestep part is counted once a row: exact at one video a batch (the presets); a batch of B shares it,
    so B rows make (B - 1) x it less (2.6e10 a timestep at real size, against 3.5e15 a call)."""
    video, audio, t = tokens(config, vae_config, signature)
    s = video + audio + t
    d = int(get(config, "hidden_size", 5376))
    inner = int(get(config, "num_attention_heads", 56)) * int(get(config, "attention_head_dim", 128))
    ffn = int(get(config, "ffn_dim", 14336))
    layers = int(get(config, "num_layers", 50))
    refiners = int(get(config, "num_refiner_layers", 2))
    c_video = int(get(config, "in_channels", 24)) * math.prod(int(x) for x in get(config, "patch_size", (1, 2, 2)))
    c_audio = int(get(config, "audio_in_channels", 32))

    def block(n: int) -> float:  # attention (q, k, v, out; QK^T and AV) and the SwiGLU feed-forward over n rows
        return 4 * linear(n, d, inner) + 4.0 * n * n * inner + linear(n, d, 2 * ffn) + linear(n, ffn, d)

    calls = timesteps_per_call(signature.steps)
    mean_timesteps = sum(calls) / len(calls) if calls else 1.0
    image = (linear(video, c_video, d) + linear(audio, c_audio, d) + layers * block(s)
             + linear(s, d, c_video) + linear(s, d, c_audio) + mean_timesteps * timestep_flops(config, 1))
    prompt = linear(t, int(get(config, "text_dim", 5120)), d) + refiners * block(t)
    return FlopCount(per_forward_image=image, per_forward_prompt=prompt, steps=len(calls), rows=1)
