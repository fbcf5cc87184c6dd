"""Video latents -> frames, op for op as WanPipeline and SanaVideoPipeline decode them.

Both pipelines un-normalize the latents with the VAE's statistics, decode, and postprocess each
video to [F, 3, H, W] in [0, 1]. The statistics of `AutoencoderKLWan` live in its config as
Python lists; the pipelines turn them into tensors on every call, and a host-to-device copy of a
pageable tensor makes torch wait for the device (`copy_` synchronizes the stream). In the job
that wait would stall the host on the batch being denoised. So the tensors are made once per
(VAE, device, dtype), by the same ops, and kept: the same values, without the wait.
"""

from __future__ import annotations

import weakref
from typing import Dict, Tuple

import torch

_STATS: "weakref.WeakKeyDictionary[torch.nn.Module, Dict[tuple, Tuple[torch.Tensor, torch.Tensor]]]" = (
    weakref.WeakKeyDictionary())


def wan_latent_stats(vae, device: torch.device, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1/std) shaped [1, z, 1, 1, 1], as the pipelines compute them (the division on the device)."""
    per_vae = _STATS.setdefault(vae, {})
    key = (torch.device(device), dtype)
    if key not in per_vae:
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(device, dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(device, dtype)
        per_vae[key] = (mean, inv_std)
    return per_vae[key]


def latent_stats(vae, latents: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """SanaVideoPipeline's three VAE cases (Wan, LTX-2 video, anything else: identity)."""
    from diffusers import AutoencoderKLLTX2Video, AutoencoderKLWan

    if isinstance(vae, AutoencoderKLWan):
        return wan_latent_stats(vae, latents.device, latents.dtype)
    if isinstance(vae, AutoencoderKLLTX2Video):
        # The ignores: isinstance narrows `vae` to what mypy sees, and mypy types diffusers'
        # top-level exports as their dummy placeholder classes (a stub gap).
        z = vae.config.latent_channels  # type: ignore[attr-defined]  # stub gap
        mean, std = vae.latents_mean, vae.latents_std  # type: ignore[attr-defined]  # stub gap
        mean = mean.view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        return mean, 1.0 / std.view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
    z = latents.shape[1]
    mean = torch.zeros(latents.shape[1], device=latents.device, dtype=latents.dtype).view(1, z, 1, 1, 1)
    return mean, 1.0 / torch.ones(latents.shape[1], device=latents.device, dtype=latents.dtype).view(1, z, 1, 1, 1)


def decode_video(pipe, latents: torch.Tensor) -> torch.Tensor:
    """[B, z, f, h, w] latents -> [B, F, 3, H, W] in [0, 1] on the device (postprocess "pt")."""
    latents = latents.to(pipe.vae.dtype)
    mean, inv_std = latent_stats(pipe.vae, latents)
    latents = latents / inv_std + mean
    video = pipe.vae.decode(latents, return_dict=False)[0]
    return pipe.video_processor.postprocess_video(video, output_type="pt")
