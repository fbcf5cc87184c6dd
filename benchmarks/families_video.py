"""The video families (and GLM-Image) for `bench_families.py`: real transformer configs and one
denoising step each, called the way its pipeline calls it (diffusers 0.42.1).

Standard shape: 480x832, 49 frames (the issue's 480p x 49), batch 1, CFG where the preset runs it.

    wan         Wan 2.1 T2V 1.3B: 2 calls a step (cond, uncond), UMT5 text 512 x 4096
    wan_14b     Wan 2.1 T2V 14B: the same calls
    sana_video  SANA-Video 2B: 1 call a step on the CFG batch of 2, Gemma text bucketed 300 -> 128 (77 real)
    ltx2        LTX-2: 3 calls a step (CFG batch of 2; spatio-temporal guidance and modality isolation at
                batch 1), post-connector text 1024 x 3840, 51 audio latents (49 frames at 24 fps)
    glm_image   GLM-Image DiT at 1024x1024: 2 calls a step (prior tokens kept / dropped), glyph length 1,
                with the family's graph-friendly calls (jobs/models/glm_image.py)
    minimax_h3  MiniMax-H3 (30B, t2va) at 480x832x124 (its shortest clip: 5.17 s at 24 fps): 1 call a step
                (guidance-distilled) on one packed sequence of 77 text rows, 207 x 2 audio rows and
                37 x 390 video rows, video and audio rows at their own timesteps; built in bf16 with the
                checkpoint's float32 modules (`_keep_in_fp32_modules`) upcast, as from_pretrained loads it

The latents of a family that denoises two things at once (LTX-2: video and audio) are one flat
tensor split inside its step, so the benchmark's Euler loop stays generic.
"""

from __future__ import annotations

import math
import types

import torch

WAN_1_3B = dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30, text_dim=4096,
                freq_dim=256, in_channels=16, out_channels=16, patch_size=(1, 2, 2), cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6)  # Wan-AI/Wan2.1-T2V-1.3B-Diffusers
REAL = {
    "wan": WAN_1_3B,
    "wan_14b": dict(WAN_1_3B, num_attention_heads=40, ffn_dim=13824, num_layers=40),  # Wan-AI/Wan2.1-T2V-14B
    # The class defaults, which diffusers documents as the released models' (1.91B, 18.9B and 2.9B
    # parameters); not checked against the checkpoints' transformer/config.json here (offline).
    "sana_video": {},  # SanaVideoTransformer3DModel: SANA-Video 2B 480p
    "ltx2": {},  # LTX2VideoTransformer3DModel: LTX-2's 48-layer audio-video transformer
    "glm_image": {},  # GlmImageTransformer2DModel: GLM-Image's 30-layer DiT
    "minimax_h3": {},  # MiniMaxH3Transformer3DModel: its defaults are the release's (diffusers' docstring; 5376 wide, 50 layers)
}
CLASSES = {"wan": "WanTransformer3DModel", "wan_14b": "WanTransformer3DModel",
           "sana_video": "SanaVideoTransformer3DModel", "ltx2": "LTX2VideoTransformer3DModel",
           "glm_image": "GlmImageTransformer2DModel", "minimax_h3": "MiniMaxH3Transformer3DModel"}
TINY = {"wan_14b": "wan"}  # the tiny preset whose transformer stands in for the CPU smoke test
CALLS = {"wan": 2, "wan_14b": 2, "sana_video": 1, "ltx2": 3, "glm_image": 2, "minimax_h3": 1}
TEXT = {"wan": 512, "wan_14b": 512, "sana_video": 128, "ltx2": 1024, "glm_image": 1, "minimax_h3": 77}
SHAPE = (480, 832, 49)  # height, width, frames
GUIDANCE = {"wan": 5.0, "wan_14b": 5.0, "sana_video": 6.0, "ltx2": 3.0, "glm_image": 1.5}


def build(family: str, config: dict, device: str, dtype: torch.dtype):
    import diffusers

    torch.manual_seed(0)
    if family == "minimax_h3":
        return _minimax_build(config, device, dtype)
    with torch.device(device):
        model = getattr(diffusers, CLASSES[family])(**config)
    model = model.to(dtype).eval().requires_grad_(False)
    if family == "glm_image":  # what the family does to every pipeline it loads
        from jobs.models.glm_image import GlmImageFamily

        GlmImageFamily().patch(types.SimpleNamespace(transformer=model))
    return model


def _minimax_build(config: dict, device: str, dtype: torch.dtype):
    """Built in `dtype` directly (30B parameters would not fit in float32 beside their cast), then the
    modules the checkpoint keeps in float32 upcast, as from_pretrained loads them."""
    import diffusers

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = diffusers.MiniMaxH3Transformer3DModel(**config)
    finally:
        torch.set_default_dtype(default)
    for name, module in model.named_modules():
        if name and any(k in name.split(".") for k in model._keep_in_fp32_modules):
            module.float()
    return model.eval().requires_grad_(False)


def shape(family: str, tiny: bool):
    if family == "minimax_h3":
        return (64, 64, 124) if tiny else (480, 832, 124)
    if family == "glm_image":
        return (64, 64, 1) if tiny else (1024, 1024, 1)
    return (64, 64, 9) if tiny else SHAPE


def make_step(family: str, model, tiny: bool, device: str, dtype: torch.dtype):
    """(initial latents, step(forward, lat, t) -> velocity, row fields)."""
    g = torch.Generator(device).manual_seed(0)
    h, w, frames = shape(family, tiny)
    cfg = model.config
    info = {"resolution": f"{h}x{w}" + (f"x{frames}" if frames > 1 else ""), "calls_per_step": CALLS[family],
            "text_len": min(TEXT[family], 32) if tiny and family != "glm_image" else TEXT[family]}
    length = info["text_len"]

    def randn(*size):
        return torch.randn(*size, generator=g, device=device)

    if family in ("wan", "wan_14b", "sana_video"):
        f = (frames - 1) // 4 + 1  # the Wan VAE: 8x space, 4x time
        lat = randn(1, cfg.in_channels, f, h // 8, w // 8)
        width = cfg.text_dim if family != "sana_video" else cfg.caption_channels
        pos, neg = randn(1, length, width).to(dtype), randn(1, length, width).to(dtype)
        scale = GUIDANCE[family]
        if family == "sana_video":
            real = min(77, length)
            mask = (torch.arange(length, device=device) < real).long()[None].repeat(2, 1)
            mask[0, 5:] = 0  # the negative's few real tokens
            text = torch.cat([neg, pos])

            def step(fwd, lat, t):
                out = fwd(torch.cat([lat] * 2).to(dtype), encoder_hidden_states=text, encoder_attention_mask=mask,
                          timestep=t.expand(2), return_dict=False)[0].float()
                uncond, cond = out.chunk(2)
                return uncond + scale * (cond - uncond)
            return lat, step, info

        def step(fwd, lat, t):
            x = lat.to(dtype)
            cond = fwd(hidden_states=x, timestep=t.expand(1), encoder_hidden_states=pos, attention_kwargs=None,
                       return_dict=False)[0].float()
            uncond = fwd(hidden_states=x, timestep=t.expand(1), encoder_hidden_states=neg, attention_kwargs=None,
                         return_dict=False)[0].float()
            return uncond + scale * (cond - uncond)
        return lat, step, info

    if family == "ltx2":
        return _ltx2_step(model, h, w, frames, length, randn, dtype, device, tiny, info)
    if family == "minimax_h3":
        return _minimax_step(model, h, w, frames, length, randn, dtype, device, info)

    # glm_image: latents /8, patch 2; prior tokens on the 1/16 grid; glyph text of one row
    lat = randn(1, cfg.in_channels, h // 8, w // 8)
    tokens = (h // 16) * (w // 16)
    prior = torch.randint(0, cfg.prior_vq_quantizer_codebook_size, (1, tokens), generator=g, device=device)
    keep, drop = torch.zeros_like(prior, dtype=torch.bool), torch.ones_like(prior, dtype=torch.bool)
    glyph, empty = randn(1, length, cfg.text_embed_dim).to(dtype), randn(1, 1, cfg.text_embed_dim).to(dtype)
    size, crop = torch.tensor([[float(h), float(w)]], device=device, dtype=dtype), torch.zeros(1, 2, device=device, dtype=dtype)
    scale = GUIDANCE[family]

    def step(fwd, lat, t):
        kw = dict(hidden_states=lat.to(dtype), prior_token_id=prior, timestep=t.expand(1) - 1, target_size=size,
                  crop_coords=crop, attention_kwargs=None, return_dict=False, kv_caches=None)
        cond = fwd(encoder_hidden_states=glyph, prior_token_drop=keep, **kw)[0].float()
        uncond = fwd(encoder_hidden_states=empty, prior_token_drop=drop, **kw)[0].float()
        return uncond + scale * (cond - uncond)
    return lat, step, info


def _minimax_step(model, h, w, frames, length, randn, dtype, device, info):
    """One call a step on the packed sequence the family builds (jobs/models/minimax_h3.py): the layout of
    MiniMaxH3PrepareLayoutStep, video rows at the step's t and audio rows at a lower one (two distinct
    timesteps, the steady state of the two schedules), latents float32 as the pipeline keeps them."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (audio_latent_num_frames,
                                                                           video_latent_num_frames)

    cfg = model.config
    lf, lh, lw = video_latent_num_frames(frames, 17, 5), h // 16, w // 16  # the video VAE: 16x space, 17-frame chunks
    n_audio = audio_latent_num_frames(frames)
    pos, tags, video_idx, audio_idx, text_idx, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(length, dtype=torch.long), lf, lh, lw, n_audio, tuple(cfg.patch_size), 2, 2, 0)
    layout = dict(position_ids=pos.to(device), token_tags=tags.to(device), video_indices=video_idx.to(device),
                  audio_indices=audio_idx.to(device), text_indices=text_idx.to(device))
    indices = torch.ones(pos.shape[0], dtype=torch.long, device=device)
    indices[layout["audio_indices"]] = 0  # distinct timesteps sorted: [audio t, video t]
    nv, na = video_idx.numel(), audio_idx.numel()
    cv, ca = cfg.in_channels * math.prod(cfg.patch_size), cfg.audio_in_channels
    lat = torch.cat([randn(1, nv * cv), randn(1, na * ca)], dim=1)
    text = randn(1, length, cfg.text_dim).to(dtype)
    info["text_len"] = length

    def step(fwd, lat, t):
        tv = t.float().reshape(1) / 1000
        v, a = fwd(hidden_states=lat[:, :nv * cv].view(1, nv, cv), audio_hidden_states=lat[:, nv * cv:].view(1, na, ca),
                   encoder_hidden_states=text, timestep=torch.cat([tv * 0.5, tv]), timestep_indices=indices,
                   return_dict=False, **layout)
        return torch.cat([v.float().flatten(1), a.float().flatten(1)], dim=1)
    return lat, step, info


def _ltx2_step(model, h, w, frames, length, randn, dtype, device, tiny, info):
    cfg = model.config
    fps = 24.0
    spatial, temporal = (8, 4) if tiny else (32, 8)  # the tiny preset's VAE; LTX-2's
    lf, lh, lw = (frames - 1) // temporal + 1, h // spatial, w // spatial
    audio_len = round(frames / fps * 16000 / 160 / 4)
    n_video, n_audio = lf * lh * lw, audio_len
    video_c, audio_c = cfg.in_channels, cfg.audio_in_channels
    lat = torch.cat([randn(1, n_video * video_c), randn(1, n_audio * audio_c)], dim=1)
    text = randn(3, length, cfg.caption_channels).to(dtype)  # negative, positive (video); the audio side reuses it
    video_coords = model.rope.prepare_video_coords(1, lf, lh, lw, device, fps=fps)
    audio_coords = model.audio_rope.prepare_audio_coords(1, audio_len, device)
    ones = torch.ones(1, length, device=device, dtype=torch.long)
    scale, stg, mod, rescale_audio = GUIDANCE["ltx2"], 1.0, 3.0, 7.0
    info["text_len"] = length

    def call(fwd, x, a, t, embeds, b, **kw):
        return fwd(hidden_states=x, audio_hidden_states=a, encoder_hidden_states=embeds,
                   audio_encoder_hidden_states=embeds, timestep=t.expand(b), sigma=t.expand(b),
                   encoder_attention_mask=ones.repeat(b, 1), audio_encoder_attention_mask=ones.repeat(b, 1),
                   num_frames=lf, height=lh, width=lw, fps=fps, audio_num_frames=audio_len,
                   video_coords=video_coords.repeat((b,) + (1,) * (video_coords.ndim - 1)),
                   audio_coords=audio_coords.repeat((b,) + (1,) * (audio_coords.ndim - 1)),
                   perturbation_mask=None, use_cross_timestep=True, attention_kwargs=None, return_dict=False, **kw)

    def step(fwd, lat, t):
        x = lat[:, :n_video * video_c].view(1, n_video, video_c).to(dtype)
        a = lat[:, n_video * video_c:].view(1, n_audio, audio_c).to(dtype)
        v2, a2 = call(fwd, torch.cat([x] * 2), torch.cat([a] * 2), t, text[:2], 2, isolate_modalities=False,
                      spatio_temporal_guidance_blocks=None)
        v_stg, a_stg = call(fwd, x, a, t, text[1:2], 1, isolate_modalities=False, spatio_temporal_guidance_blocks=[28])
        v_mod, a_mod = call(fwd, x, a, t, text[1:2], 1, isolate_modalities=True, spatio_temporal_guidance_blocks=None)
        (vu, vc), (au, ac) = v2.float().chunk(2), a2.float().chunk(2)
        video = vc + (scale - 1) * (vc - vu) + stg * (vc - v_stg.float()) + (mod - 1) * (vc - v_mod.float())
        audio = ac + (rescale_audio - 1) * (ac - au) + stg * (ac - a_stg.float()) + (mod - 1) * (ac - a_mod.float())
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)
    return lat, step, info
