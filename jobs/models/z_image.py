"""Z-Image (diffusers `ZImagePipeline`, `ZImageTransformer2DModel`, `AutoencoderKL`).

The pipeline hands its transformer a *list* of per-prompt captions `[L_i, D]` (the encoder's
second-to-last hidden state at the real tokens of the chat-templated prompt); the transformer pads
each to a multiple of 32 with a learned, attended pad token. The job carries a batch as one
`[B, S, D]` tensor plus a mask of each row's real tokens, and `denoise_decode` hands the pipeline
`embeds[i][mask[i]]`: exactly the pipeline's own list, whatever storage padding the padder added
(padding/z_image.py explains why the bucket is the exact caption length).

Guidance keeps the pipeline's meaning, so model-card values carry over: with CFG the prediction is
`pos + s * (pos - neg)`. The job runs CFG only for `sampling.guidance_scale > 1` (its rule for all
families); otherwise the pipeline gets 0, which turns its CFG off (Z-Image-Turbo runs at 0).
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

# diffusers' transformer_z_image.py: captions and images are padded to multiples of SEQ_MULTI_OF, and
# axes_lens defaults to this where a transformer config leaves it out.
SEQ_MULTI_OF = 32
AXES_LENS = (1024, 512, 512)


def chat_texts(tokenizer, prompts: Sequence[str]) -> List[str]:
    """The pipeline's prompt text: one user turn, generation prompt, thinking enabled."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True, enable_thinking=True) for p in prompts]


class ZImageFamily(ModelFamily):
    name = "z_image"
    pipeline_class = "ZImagePipeline"

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKL, ZImagePipeline, ZImageTransformer2DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        torch.manual_seed(int(tiny.seed))
        transformer = ZImageTransformer2DModel(**tiny.transformer)
        with torch.no_grad():
            # diffusers initialises the learned pad tokens to zero; a trained model's are not, and
            # zero pad tokens would make the tiny model kinder to padding than the real one.
            # The ignores: mypy types diffusers' top-level exports as their dummy placeholder classes (a stub gap).
            transformer.x_pad_token.normal_()  # type: ignore[attr-defined]  # stub gap
            transformer.cap_pad_token.normal_()  # type: ignore[attr-defined]  # stub gap
        pipe = ZImagePipeline(
            transformer=transformer,
            vae=AutoencoderKL(**tiny.vae),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            tokenizer=tiny_tokenizer(tiny.text_encoder),
            scheduler=build_scheduler(tiny.scheduler),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae, tr = self.component_config(cfg, "vae"), self.component_config(cfg, "transformer")
        patch = int(list(tr.get("all_patch_size", [2]))[0])
        return 2 ** (len(vae["block_out_channels"]) - 1) * patch

    # -- text ------------------------------------------------------------------------------
    def text_length_limit(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        # Qwen3 has rotary positions, but the transformer's rope table does not: `patchify_and_embed` pads a
        # caption to a multiple of SEQ_MULTI_OF and numbers it 1.., the image from the next position, and a
        # position past the table was an IndexError (CUDA: a device-side assert) once a long prompt came.
        rows = int(list(self.component_config(cfg, "transformer").get("axes_lens", AXES_LENS))[0])
        most = (rows - 2) // SEQ_MULTI_OF * SEQ_MULTI_OF
        return most, (f"ZImageTransformer2DModel's rope table has {rows} positions on its text axis (the "
                      f"transformer's axes_lens[0]), and a caption padded to a multiple of {SEQ_MULTI_OF} plus the "
                      f"image's first position must fit in them: at most {most} caption tokens")

    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        raw = [len(ids) for ids in tokenizer(chat_texts(tokenizer, prompts))["input_ids"]]
        return [TextLength(used=max(1, min(n, limit)), raw=n, limit=limit) for n in raw]

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        import torch

        # list(): _encode_prompt rewrites its prompt list in place with the chat template
        captions, _ = pipe.encode_prompt(list(prompts), device=device, do_classifier_free_guidance=False,
                                         max_sequence_length=cfg.max_sequence_length)
        lengths = torch.tensor([len(c) for c in captions], device=captions[0].device)
        embeds = torch.nn.utils.rnn.pad_sequence(captions, batch_first=True)
        mask = (torch.arange(embeds.shape[1], device=embeds.device)[None, :] < lengths[:, None]).long()
        return TextEmbeds(embeds=embeds, mask=mask)

    # -- denoise ---------------------------------------------------------------------------
    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos, neg = request.positive, request.negative
        cfg_on = neg is not None
        return dict(
            prompt_embeds=captions(pos),
            negative_prompt_embeds=captions(neg) if neg is not None else None,
            guidance_scale=request.guidance_scale if cfg_on else 0.0,
            num_inference_steps=request.steps,
            height=request.height,
            width=request.width,
            generator=cpu_generators(request.seeds),
        )


def captions(text: TextEmbeds) -> List[torch.Tensor]:
    """The pipeline's caption list: each row's real tokens, at its native length."""
    assert text.mask is not None  # ZImageFamily.encode always gives the mask of the real tokens
    keep = text.mask.bool()
    return [text.embeds[i][keep[i]] for i in range(text.embeds.shape[0])]


register_family(ZImageFamily())
