"""Fixed-length text encoders whose denoiser attends to the padding: pass through, never re-bucket.

Flux.1 pads T5 to `max_sequence_length` (512 for dev), LongCat-Image pads its Qwen2.5-VL text to
512, and Wan pads each prompt's UMT5 embeddings with zero rows to 512; in all three, every prompt
reaches the transformer at that one length with no text mask, and attention reads the pad
positions like any other token. Cutting or growing that sequence
would change the image, so `pad()` to any other length raises `PaddingRefused` saying why. Every
prompt already has the same length, so every prompt shares one text bucket: nothing is lost.
"""

from __future__ import annotations

import logging
from typing import Sequence

from padding.base import Padder, PaddingRefused, TextEmbeds
from padding.registry import register_padder

log = logging.getLogger(__name__)


class FixedLengthPadder(Padder):
    masks_padding = False
    #: why this family's padding cannot move (goes into the refusal message)
    reason: str = ""

    def __init__(self, buckets: Sequence[int], native_length: int):
        self.native_length = int(native_length)
        ignored = sorted({int(b) for b in buckets} - {self.native_length})
        if ignored:
            # Not an error: bcg.text_buckets may be set for a whole sweep of models.
            log.info("%s: text buckets %s ignored; every prompt runs at the fixed length %d (%s)",
                     self.name, ignored, self.native_length, self.reason)

    def bucket_for(self, length: int) -> int:
        return self.native_length

    def pad(self, text: TextEmbeds, bucket: int) -> TextEmbeds:
        if bucket == text.length == self.native_length:
            return text
        raise PaddingRefused(
            f"{self.name}: refusing to change the text length from {text.length} to {bucket}: {self.reason}. "
            f"Every prompt runs at {self.native_length}; set model.max_sequence_length to the encoder's length")


@register_padder("flux")
class FluxPadder(FixedLengthPadder):
    name = "flux"
    reason = ("Flux's T5 text is padded to max_sequence_length and its joint attention has no text mask, "
              "so pad tokens are attended and changing their number changes the image")


@register_padder("longcat_image")
class LongCatImagePadder(FixedLengthPadder):
    name = "longcat_image"
    reason = ("LongCat-Image always encodes 512 text positions (pad tokens included) and its transformer takes "
              "no text mask, so pad tokens are attended and changing their number changes the image")


@register_padder("wan")
class WanPadder(FixedLengthPadder):
    """Wan 2.1/2.2: every prompt at max_sequence_length (512), as WanPipeline makes it.

    `_get_t5_prompt_embeds` cuts each prompt's UMT5 output to its true length and re-pads it with
    zero rows to 512, and `WanTransformer3DModel.forward` takes no text mask. The zero rows are not
    inert: the text projection (Linear, GELU, Linear, with biases) turns each into the same non-zero
    vector, and every cross-attention query attends to all 512 rows, so the number of pad rows
    weighs on the softmax. Fewer or more rows change the video (tests/test_family_wan.py)."""

    name = "wan"
    reason = ("WanPipeline re-pads each prompt with zero rows to max_sequence_length and its transformer takes no "
              "text mask, so the pad rows are attended (its text projection makes them non-zero) and changing "
              "their number changes the video")
