"""Wan 2.1 / 2.2 text-to-video (diffusers `WanPipeline`, `WanTransformer3DModel`, `AutoencoderKLWan`).

Text, as diffusers 0.42.1's `WanPipeline._get_t5_prompt_embeds` makes it: the prompt is cleaned
(`prompt_clean`), tokenized to max_sequence_length (512) by UMT5's tokenizer, encoded with the
tokenizer's mask, then each prompt's embeddings are cut to its true length and re-padded with
zero rows to 512. The transformer takes no text mask, and its text projection maps a zero row
to a non-zero vector (biases), which every video token attends to: the number of pad rows is
part of the input. So every prompt runs at 512 and the padder passes it through, refusing any
other length (padding/passthrough.py; tests/test_family_wan.py shows a shorter or longer pad
changes the output). Nothing is lost: every prompt has the same length, so all share one bucket.
The mask kept in `TextEmbeds` is the tokenizer's; the model never reads it, the job uses it only
to check that no real token was cut.

Frames: the VAE compresses time by 4 (`scale_factor_temporal`), so a clip has 4k+1 frames (81 by
default); the pipeline would silently round other counts, so the family refuses them. Sizes are
multiples of 16 (VAE 8x times patch 2; Wan 2.2 TI2V-5B: 32).

Wan 2.2: TI2V-5B (one transformer, `expand_timesteps`) runs as is. A14B's two experts
(`transformer_2`, `boundary_ratio`) are refused for now: the job graphs one transformer.
"""

from __future__ import annotations

import html
import importlib.util
import math
import os
import re
from typing import TYPE_CHECKING, List, Optional, Sequence

from jobs.config import ModelConfig
from jobs.errors import UserError
from jobs.models.base import DenoiseRequest, ModelFamily, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

# AutoencoderKLWan's defaults, for VAE configs that do not spell them out (Wan 2.1's checkpoints).
TEMPORAL, SPATIAL = 4, 8
PIPELINE_MULTIPLE = 16  # WanPipeline.check_inputs: height and width divisible by 16


def frames_rule_error(n: int, temporal: int, pipeline: str) -> Optional[str]:
    """A clip of a temporal-compressing VAE has temporal*k + 1 frames."""
    if (n - 1) % temporal == 0:
        return None
    lower = (n - 1) // temporal * temporal + 1
    return (f"num_frames={n}, but {pipeline} makes {temporal}k+1 frames (its VAE compresses time by {temporal}); "
            f"use {lower} or {lower + temporal}")


def prompt_clean(text: str) -> str:
    """diffusers' `pipeline_wan.prompt_clean`, copied: importing that module costs every planner
    process ~5 s. tests/test_family_wan.py checks the copy against the original."""
    if importlib.util.find_spec("ftfy") is not None:  # the pipeline fixes text with ftfy when it is installed
        import ftfy

        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def clean_prompts(prompts: Sequence[str]) -> List[str]:
    return [prompt_clean(p) for p in prompts]


class WanFamily(ModelFamily):
    name = "wan"
    pipeline_class = "WanPipeline"
    video = True

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        torch.manual_seed(int(tiny.seed))
        pipe = WanPipeline(
            tokenizer=tiny_tokenizer(tiny.text_encoder),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            vae=AutoencoderKLWan(**tiny.vae),
            scheduler=build_scheduler(tiny.scheduler),
            transformer=WanTransformer3DModel(**tiny.transformer),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def check_path(self, cfg: ModelConfig) -> None:
        super().check_path(cfg)
        from jobs.models.checkpoint import read_json

        assert cfg.path is not None  # preflight checks a path only where model.path is set

        index = read_json(os.path.join(cfg.path, "model_index.json"))
        second = index.get("transformer_2")
        if isinstance(second, list) and any(second):
            raise UserError(f"model.path={cfg.path!r} is a two-expert Wan 2.2 checkpoint (transformer_2, "
                             f"boundary_ratio {index.get('boundary_ratio')}): bcgen graphs one transformer per "
                             f"pipeline and does not run A14B's second expert yet; use Wan 2.1 or Wan 2.2 TI2V-5B")

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae, tr = self.component_config(cfg, "vae"), self.component_config(cfg, "transformer")
        spatial = int(vae.get("scale_factor_spatial") or SPATIAL)
        _, ph, pw = (int(p) for p in tr.get("patch_size", (1, 2, 2)))
        return math.lcm(PIPELINE_MULTIPLE, spatial * ph, spatial * pw)

    def frames_error(self, cfg: ModelConfig, n: int) -> Optional[str]:
        temporal = int(self.component_config(cfg, "vae").get("scale_factor_temporal") or TEMPORAL)
        return frames_rule_error(n, temporal, self.pipeline_class)

    # -- text ------------------------------------------------------------------------------
    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        raw = [len(ids) for ids in tokenizer(clean_prompts(prompts), add_special_tokens=True)["input_ids"]]
        return [TextLength(used=max(1, min(n, limit)), raw=n, limit=limit) for n in raw]

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        prompts = list(prompts)
        embeds, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False,
                                       max_sequence_length=cfg.max_sequence_length, device=device)
        mask = pipe.tokenizer(clean_prompts(prompts), padding="max_length", max_length=cfg.max_sequence_length,
                              truncation=True, add_special_tokens=True, return_tensors="pt").attention_mask
        return TextEmbeds(embeds=embeds, mask=mask.to(embeds.device))

    # -- denoise + decode ------------------------------------------------------------------
    denoise_output = "latent"

    def decode(self, pipe, latents: torch.Tensor, request: DenoiseRequest) -> torch.Tensor:
        from jobs.models.video_decode import decode_video

        return decode_video(pipe, latents)

    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos, neg = request.positive, request.negative
        cfg_on = neg is not None
        return dict(
            prompt_embeds=pos.embeds,
            negative_prompt_embeds=neg.embeds if neg is not None else None,
            guidance_scale=request.guidance_scale if cfg_on else 1.0,  # the pipeline runs CFG for > 1
            height=request.height,
            width=request.width,
            num_frames=request.num_frames,
            num_inference_steps=request.steps,
            generator=cpu_generators(request.seeds),
            max_sequence_length=pos.length,
        )


register_family(WanFamily())
