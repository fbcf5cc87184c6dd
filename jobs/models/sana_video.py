"""SANA-Video (diffusers `SanaVideoPipeline`, `SanaVideoTransformer3DModel`, `AutoencoderKLWan`).

Text is encoded as SANA encodes it (`_get_gemma_prompt_embeds` and `encode_prompt` are copies of
SanaPipeline's: lower-case, right padding to max_sequence_length 300, the optional complex human
instruction and its select index), so SANA's text lengths and encoding apply unchanged; the
transformer masks the padding, so the padder re-cuts the 300 positions to buckets
(padding/sana_video.py says why that is lossless).

Frames: the released checkpoints decode with the Wan VAE (time compressed 4x: 4k+1 frames, 81 by
default); sizes are multiples of 32 (`SanaVideoPipeline.check_inputs`). Resolution binning is off:
the plan validated the size, and binning would resize.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from jobs.config import ModelConfig
from jobs.models.base import DenoiseRequest
from jobs.models.registry import register_family
from jobs.models.sana import SanaFamily
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from jobs.models.wan import SPATIAL, TEMPORAL, frames_rule_error

if TYPE_CHECKING:
    import torch

PIPELINE_MULTIPLE = 32  # SanaVideoPipeline.check_inputs: height and width divisible by 32


class SanaVideoFamily(SanaFamily):
    name = "sana_video"
    pipeline_class = "SanaVideoPipeline"
    video = True

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKLWan, SanaVideoPipeline, SanaVideoTransformer3DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        torch.manual_seed(int(tiny.seed))
        pipe = SanaVideoPipeline(
            tokenizer=tiny_tokenizer(tiny.text_encoder),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            vae=AutoencoderKLWan(**tiny.vae),
            transformer=SanaVideoTransformer3DModel(**tiny.transformer),
            scheduler=build_scheduler(tiny.scheduler),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def load_tokenizer(self, cfg: ModelConfig):
        if cfg.path is None:  # the tiny preset's `text_encoder` section (a dict, unlike SANA's string)
            assert cfg.tiny is not None  # preflight refuses model.path=None without a tiny section
            return tiny_tokenizer(cfg.tiny.text_encoder)
        return super().load_tokenizer(cfg)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae, tr = self.component_config(cfg, "vae"), self.component_config(cfg, "transformer")
        # AutoencoderKLWan's scale_factor_spatial (SanaVideoPipeline reads it; LTX-2's and DC's VAEs
        # name it otherwise: spatial_compression_ratio)
        spatial = int(vae.get("scale_factor_spatial") or vae.get("spatial_compression_ratio") or SPATIAL)
        _, ph, pw = (int(p) for p in tr.get("patch_size", (1, 2, 2)))
        return math.lcm(PIPELINE_MULTIPLE, spatial * ph, spatial * pw)

    def frames_error(self, cfg: ModelConfig, n: int) -> Optional[str]:
        vae = self.component_config(cfg, "vae")
        temporal = int(vae.get("scale_factor_temporal") or vae.get("temporal_compression_ratio") or TEMPORAL)
        return frames_rule_error(n, temporal, self.pipeline_class)

    # -- denoise + decode ------------------------------------------------------------------
    def warmup_latents(self, pipe, size: int, height: int, width: int, num_frames: int, device,
                       generator: torch.Generator) -> Optional[torch.Tensor]:
        return None  # not SanaFamily's image latents; a video's first decode is a small share of its batch

    def decode(self, pipe, latents: torch.Tensor, request: DenoiseRequest) -> torch.Tensor:
        from jobs.models.video_decode import decode_video

        return decode_video(pipe, latents)

    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        kwargs = super().pipeline_kwargs(request)
        kwargs["frames"] = request.num_frames
        return kwargs


register_family(SanaVideoFamily())
