"""LongCat-Image (diffusers `LongCatImagePipeline`, `LongCatImageTransformer2DModel`, `AutoencoderKL`).

Text: the pipeline tokenizes the prompt (quoted spans token by token), pads it to 512 with the pad
token, wraps it in its chat template, runs Qwen2.5-VL and keeps the 512 prompt positions. The
transformer takes no text mask, so every prompt reaches it at 512 with its pad positions attended:
the padder passes it through (padding/passthrough.py). The mask in `TextEmbeds` marks the prompt's
real tokens for the job's checks only.

Two ways this family drives the pipeline differently from its defaults:
- `enable_prompt_rewrite=False`: the default rewrites every prompt by *generating* up to 512
  tokens with the 7B text encoder (and needs the `text_processor`, which is therefore not loaded).
  A batch job encodes exactly the prompts it was given.
- `accept_embeddings`: diffusers 0.42.1's `encode_prompt` takes its batch size from `prompt`, so
  precomputed embeddings fail (`len(None)` for the positive; the negative's default `""` gives 1,
  and a batch of B negatives is silently reshaped to [1, 512, B*D]). The replacement used for
  precomputed embeddings returns them with the pipeline's own text position ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Sequence

from jobs.config import ModelConfig
from jobs.errors import UserError
from jobs.models.base import DenoiseRequest, ModelFamily, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

# text_processor is left out on purpose: only the prompt rewriter uses it (see module docstring).
TEXT_LENGTH = 512  # LongCatImagePipeline.tokenizer_max_length, fixed in its __init__


def token_counts(tokenizer, prompts: Sequence[str]) -> List[int]:
    """The pipeline's token count per prompt, before its cut to 512 (split_quotation, no specials)."""
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import split_quotation

    counts = []
    for prompt in prompts:
        n = 0
        for part, quoted in split_quotation(prompt):
            pieces = list(part) if quoted else [part]  # quoted text is tokenized character by character
            n += sum(len(ids) for ids in tokenizer(pieces, add_special_tokens=False)["input_ids"])
        counts.append(n)
    return counts


def accept_embeddings(pipe) -> None:
    """Let `pipe.__call__` take precomputed embeddings (see module docstring)."""
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

    encode_prompts = pipe.encode_prompt  # the bound original, still used to encode text

    def encode_prompt(prompt=None, num_images_per_prompt=1, prompt_embeds=None):
        if prompt_embeds is None:
            return encode_prompts(prompt=prompt, num_images_per_prompt=num_images_per_prompt)
        assert num_images_per_prompt == 1, "the job makes one image per prompt row"
        ids = prepare_pos_ids(modality_id=0, type="text", start=(0, 0), num_token=prompt_embeds.shape[1])
        return prompt_embeds.to(pipe.device), ids.to(pipe.device)

    pipe.encode_prompt = encode_prompt


class LongCatImageFamily(ModelFamily):
    name = "longcat_image"
    pipeline_class = "LongCatImagePipeline"

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKL, LongCatImagePipeline, LongCatImageTransformer2DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        torch.manual_seed(int(tiny.seed))
        pipe = LongCatImagePipeline(
            transformer=LongCatImageTransformer2DModel(**tiny.transformer),
            vae=AutoencoderKL(**tiny.vae),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            tokenizer=tiny_tokenizer(tiny.text_encoder),
            text_processor=None,
            scheduler=build_scheduler(tiny.scheduler),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def from_pretrained(self, cfg: ModelConfig, dtype: torch.dtype, **components):
        return super().from_pretrained(cfg, dtype, text_processor=None, **components)

    def patch(self, pipe) -> None:
        accept_embeddings(pipe)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae = self.component_config(cfg, "vae")
        return 2 ** (len(vae["block_out_channels"]) - 1) * 2  # VAE x the 2x2 latent packing

    # -- text ------------------------------------------------------------------------------
    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        if cfg.max_sequence_length != TEXT_LENGTH:
            raise UserError(f"model.max_sequence_length={cfg.max_sequence_length}, but LongCatImagePipeline always "
                             f"encodes {TEXT_LENGTH} text positions; set model.max_sequence_length={TEXT_LENGTH}")
        return [TextLength(used=max(1, min(n, TEXT_LENGTH)), raw=n, limit=TEXT_LENGTH)
                for n in token_counts(tokenizer, prompts)]

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        import torch

        embeds, _ = pipe.encode_prompt(prompt=list(prompts))
        used = torch.tensor([min(n, embeds.shape[1]) for n in token_counts(pipe.tokenizer, prompts)])
        mask = (torch.arange(embeds.shape[1])[None, :] < used[:, None]).long().to(embeds.device)
        return TextEmbeds(embeds=embeds.to(device), mask=mask.to(device))

    # -- denoise ---------------------------------------------------------------------------
    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos, neg = request.positive, request.negative
        cfg_on = neg is not None
        return dict(
            prompt_embeds=pos.embeds,
            negative_prompt_embeds=neg.embeds if neg is not None else None,
            guidance_scale=request.guidance_scale if cfg_on else 1.0,  # the pipeline runs CFG for > 1
            enable_prompt_rewrite=False,
            num_inference_steps=request.steps,
            height=request.height,
            width=request.width,
            generator=cpu_generators(request.seeds),
        )


register_family(LongCatImageFamily())
