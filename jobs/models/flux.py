"""Flux.1 (diffusers `FluxPipeline`, `FluxTransformer2DModel`, `AutoencoderKL`).

Text: CLIP gives the pooled vector, T5 the sequence, padded to `max_sequence_length` (512 for
Flux.1-dev, 256 for schnell). The transformer takes no text mask, so the T5 pad tokens are
attended: every prompt runs at that one length and the padder passes it through
(padding/passthrough.py). The mask kept in `TextEmbeds` is T5's tokenizer mask; the model never
reads it, the job uses it only to check that no real token was cut.

Guidance: Flux.1-dev is guidance-distilled, so `sampling.guidance_scale` goes to the transformer's
guidance embedding (3.5 by default) and no negative branch runs; the negative embeddings the job
encodes when guidance > 1 are not used. A checkpoint without a guidance embedding (schnell)
ignores the scale. FluxPipeline's optional `true_cfg_scale` is not used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from jobs.config import ModelConfig
from jobs.models.base import DenoiseRequest, ModelFamily, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

T5_MAX = 512  # FluxPipeline.check_inputs: "`max_sequence_length` cannot be greater than 512"


class FluxFamily(ModelFamily):
    name = "flux"
    pipeline_class = "FluxPipeline"
    tokenizer_folder, tiny_tokenizer_key = "tokenizer_2", "t5"  # T5 decides the sequence the transformer sees
    components = ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler")

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        assert tiny.clip is not None and tiny.t5 is not None, "a Flux tiny preset has model.tiny.clip and .t5"
        torch.manual_seed(int(tiny.seed))
        pipe = FluxPipeline(
            transformer=FluxTransformer2DModel(**tiny.transformer),
            vae=AutoencoderKL(**tiny.vae),
            text_encoder=tiny_text_encoder(tiny.clip),
            tokenizer=tiny_tokenizer(tiny.clip),
            text_encoder_2=tiny_text_encoder(tiny.t5),
            tokenizer_2=tiny_tokenizer(tiny.t5),
            scheduler=build_scheduler(tiny.scheduler),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae = self.component_config(cfg, "vae")
        return 2 ** (len(vae["block_out_channels"]) - 1) * 2  # VAE x the 2x2 latent packing

    # -- text ------------------------------------------------------------------------------
    def text_length_limit(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        # T5 has relative positions; the cap is the pipeline's own (CLIP always takes its 77 tokens).
        return T5_MAX, (f"FluxPipeline takes at most {T5_MAX} T5 text positions (its check_inputs refuses more, "
                        f"once the model has loaded)")

    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        raw = [len(ids) for ids in tokenizer(list(prompts))["input_ids"]]
        return [TextLength(used=max(1, min(n, limit)), raw=n, limit=limit) for n in raw]

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        prompts = list(prompts)
        embeds, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device,
                                               max_sequence_length=cfg.max_sequence_length)
        mask = pipe.tokenizer_2(prompts, padding="max_length", max_length=cfg.max_sequence_length, truncation=True,
                                return_tensors="pt").attention_mask.to(embeds.device)
        return TextEmbeds(embeds=embeds, mask=mask, extras={"pooled": pooled})

    # -- denoise ---------------------------------------------------------------------------
    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos = request.positive
        return dict(
            prompt_embeds=pos.embeds,
            pooled_prompt_embeds=pos.extras["pooled"],
            guidance_scale=request.guidance_scale,  # the distilled guidance embedding (see module docstring)
            true_cfg_scale=1.0,
            num_inference_steps=request.steps,
            height=request.height,
            width=request.width,
            generator=cpu_generators(request.seeds),
            max_sequence_length=pos.length,
        )


register_family(FluxFamily())
