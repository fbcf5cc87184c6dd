"""Qwen-Image (diffusers `QwenImagePipeline`, `QwenImageTransformer2DModel`, `AutoencoderKLQwenImage`).

Encoding is the pipeline's own `encode_prompt`, one prompt a call: the chat template around the
prompt, Qwen2.5-VL's last hidden state, the first `prompt_template_encode_start_idx` (34) template
positions dropped; the rows then right-padded to the batch's longest prompt with mask 0, as
`encode_prompt` pads a batch (whose own call would make a prompt's bytes follow that length). The
plan mirrors that count from the tokenizer alone. The padder then grows (or re-cuts) the embeddings
and mask to the text bucket.

Two host-side wrinkles, both fixed without touching model weights or the forward:
- The pipeline's `encode_prompt` replaces an all-ones mask with None (a prompt that exactly fills
  its bucket), which would give the same bucket two graph signatures (a mask tensor vs None).
  `keep_text_mask` puts an all-ones mask back before the transformer runs.
- diffusers' `compute_text_seq_len_from_mask` builds a fallback length with
  `torch.as_tensor(int, device=cuda)`, a synchronous host-to-device copy that CUDA graph capture
  forbids, so the whole forward could not be captured. `capturable_text_lengths` swaps in a copy
  that makes the same value with `torch.full` (a device fill); its outputs are identical
  (tests/test_family_qwen_image.py compares them with the original's).

The tiny preset's text side comes from jobs/models/tiny.py: a seeded random instance of the real
transformers class from a config dict, and a fresh offline tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Protocol, Sequence, Tuple, cast

from jobs.config import ModelConfig
from jobs.models.base import DenoiseRequest, ModelFamily, TextLength, cpu_generators
from jobs.models.registry import register_family
from jobs.models.tiny import build_scheduler, tiny_text_encoder, tiny_tokenizer
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch

# QwenImagePipeline.__init__ sets these per instance; the plan needs them before any pipeline
# exists. tests/test_family_qwen_image.py checks they still equal the installed pipeline's.
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
TEMPLATE_DROP = 34  # prompt_template_encode_start_idx
TOKENIZER_MAX = 1024  # tokenizer_max_length


def keep_text_mask(transformer: torch.nn.Module) -> None:
    """Give the transformer an all-ones mask where the pipeline dropped it (see module docstring)."""
    import torch

    def restore(module, args, kwargs):
        text = kwargs.get("encoder_hidden_states")
        if kwargs.get("encoder_hidden_states_mask") is None and text is not None:
            kwargs["encoder_hidden_states_mask"] = torch.ones(text.shape[:2], dtype=torch.long, device=text.device)
        return args, kwargs

    transformer.register_forward_pre_hook(restore, with_kwargs=True)


def _text_seq_len_from_mask(encoder_hidden_states, encoder_hidden_states_mask):
    """diffusers 0.42.1 `compute_text_seq_len_from_mask`, with `torch.full` for `torch.as_tensor`."""
    import torch

    batch_size, text_seq_len = encoder_hidden_states.shape[:2]
    if encoder_hidden_states_mask is None:
        return text_seq_len, None, None
    if encoder_hidden_states_mask.shape[:2] != (batch_size, text_seq_len):
        raise ValueError(f"`encoder_hidden_states_mask` shape {encoder_hidden_states_mask.shape} must match "
                         f"(batch_size, text_seq_len)=({batch_size}, {text_seq_len}).")
    mask = encoder_hidden_states_mask.to(torch.bool)
    device = encoder_hidden_states.device
    position_ids = torch.arange(text_seq_len, device=device, dtype=torch.long)
    active_positions = torch.where(mask, position_ids, position_ids.new_zeros(()))
    per_sample_len = torch.where(mask.any(dim=1), active_positions.max(dim=1).values + 1,
                                 torch.full((), text_seq_len, device=device, dtype=torch.long))
    return text_seq_len, per_sample_len, mask


class _Replacement(Protocol):
    """A function that keeps the one it replaced, for the equality test."""

    replaced: Callable[..., Any]


def capturable_text_lengths() -> None:
    """Install `_text_seq_len_from_mask` where QwenImageTransformer2DModel.forward looks it up."""
    from diffusers.models.transformers import transformer_qwenimage as module

    if module.compute_text_seq_len_from_mask is not _text_seq_len_from_mask:
        cast(_Replacement, _text_seq_len_from_mask).replaced = module.compute_text_seq_len_from_mask
        module.compute_text_seq_len_from_mask = _text_seq_len_from_mask


class QwenImageFamily(ModelFamily):
    name = "qwen_image"
    pipeline_class = "QwenImagePipeline"

    # -- loading ---------------------------------------------------------------------------
    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        import torch
        from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel

        tiny = cfg.tiny
        assert tiny is not None  # preflight refuses model.path=None without a tiny section
        torch.manual_seed(int(tiny.seed))  # the same preset gives the same weights everywhere
        pipe = QwenImagePipeline(
            transformer=QwenImageTransformer2DModel(**tiny.transformer),
            vae=AutoencoderKLQwenImage(**tiny.vae),
            text_encoder=tiny_text_encoder(tiny.text_encoder),
            tokenizer=tiny_tokenizer(tiny.text_encoder),
            scheduler=build_scheduler(tiny.scheduler),
        )
        return self.prepare_tiny(pipe, cfg, dtype)

    def patch(self, pipe) -> None:
        keep_text_mask(pipe.transformer)
        capturable_text_lengths()

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        vae = self.component_config(cfg, "vae")
        # the pipeline's vae_scale_factor, times 2 for the 2x2 latent packing
        return 2 ** len(vae["temperal_downsample"]) * 2

    # -- text ------------------------------------------------------------------------------
    def text_length_limit(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        # Qwen2.5-VL has rotary positions; the cap is the pipeline's: past it a prompt was cut at 1024
        # tokens (not counted as truncated) and the call refused with a traceback.
        return TOKENIZER_MAX, (f"QwenImagePipeline encodes at most {TOKENIZER_MAX} prompt tokens (its "
                               f"tokenizer_max_length; its check_inputs refuses more, once the model has loaded)")

    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        limit = cfg.max_sequence_length
        texts = [PROMPT_TEMPLATE.format(p) for p in prompts]
        out = []
        for ids in tokenizer(texts)["input_ids"]:
            # The pipeline tokenizes with truncation at TOKENIZER_MAX + TEMPLATE_DROP, drops the template
            # head, then encode_prompt cuts to max_sequence_length.
            kept = min(len(ids), TOKENIZER_MAX + TEMPLATE_DROP) - TEMPLATE_DROP
            out.append(TextLength(used=max(1, min(kept, limit)), raw=len(ids) - TEMPLATE_DROP, limit=limit))
        return out

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        """One prompt a call of the pipeline's `encode_prompt`, stacked as it stacks a batch (right-padded
        with zeros, mask 0). It pads a call's prompts to the longest, and a prompt's hidden states follow
        that length (the shapes of Qwen2.5-VL's GEMMs and attention): encoded together, a prompt's bytes
        would follow its neighbours' lengths (issue 30; on the CPU the tiny preset's did,
        tests/test_encode_neighbours.py). Alone, each call's shape is the prompt's own."""
        import torch

        rows = [pipe.encode_prompt([p], device=device, max_sequence_length=cfg.max_sequence_length)[0][0]
                for p in prompts]  # encode_prompt's mask of one prompt is None: all of it is valid
        n = max(r.shape[0] for r in rows)
        embeds = torch.stack([torch.cat([r, r.new_zeros(n - r.shape[0], r.shape[1])]) for r in rows])
        mask = torch.zeros(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        for i, r in enumerate(rows):
            mask[i, : r.shape[0]] = 1
        return TextEmbeds(embeds=embeds, mask=mask)

    # -- denoise ---------------------------------------------------------------------------
    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        pos, neg = request.positive, request.negative
        cfg_on = neg is not None
        return dict(
            prompt_embeds=pos.embeds,
            prompt_embeds_mask=pos.mask,
            negative_prompt_embeds=neg.embeds if neg is not None else None,
            negative_prompt_embeds_mask=neg.mask if neg is not None else None,
            # Qwen-Image is not guidance-distilled: its CFG scale is `true_cfg_scale`.
            true_cfg_scale=request.guidance_scale if cfg_on else 1.0,
            num_inference_steps=request.steps,
            height=request.height,
            width=request.width,
            generator=cpu_generators(request.seeds),
            max_sequence_length=pos.length,  # the bucket: the default (512) would cut a longer one
        )


register_family(QwenImageFamily())
