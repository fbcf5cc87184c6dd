"""MiniMax-H3: the packed sequence is not padded to 64-row groups; each prompt keeps its native text length.

What diffusers 0.42.1's MiniMax-H3 port does (modular_pipelines/minimax_h3/, transformer_minimax_h3.py;
tests/test_padding_minimax_h3.py proves each point on the real transformer class):

- One request is one packed sequence `[text | conditions | audio | video]`: the prompt's Qwen3-VL
  hidden states at their native length (the prompt verbatim, no template, no special tokens, no
  padding), then the media rows. The text length also shifts the media rows' rotary clock.
- The reference implementation pads that sequence to a multiple of 64 rows for FlashAttention and
  hands the kernel `cu_seqlens = [0, used, S]`: the pad rows are a second attention document that
  no real row sees. The port keeps no padding ("which this port has no use for"): its attention
  is unmasked over one document, and its blocks pass no mask to the attention processor.
- So pad rows appended as the reference appends them are keys for every real row here, and change
  the video and the audio. With a key mask that keeps them a separate document (what the reference's
  varlen split does) the real rows are unchanged up to reduction order (1e-5), but the port has no
  argument to carry such a mask from the packed layout to its processors.

The padder therefore refuses any length but the native one (`bucket_for(n) == n`: equal text lengths
share a graph, as Z-Image's captions do). Padding to 64-row groups losslessly needs an attention
processor that masks the pad rows as a separate document, fed by the layout; not built yet.
"""

from __future__ import annotations

from typing import Sequence

from padding.base import Padder, PaddingRefused, TextEmbeds
from padding.registry import register_padder

GROUP = 64  # the reference's packed-row multiple (FlashAttention tiles)


def reference_padded_rows(rows: int, group: int = GROUP) -> int:
    """The packed length the reference runs: the next multiple of `group` rows."""
    return -(-rows // group) * group


@register_padder("minimax_h3")
class MiniMaxH3Padder(Padder):
    name = "minimax_h3"
    masks_padding = False
    reason = ("MiniMax-H3's port attends over its whole packed sequence with no mask (the reference keeps its "
              "64-row padding a separate attention document through cu_seqlens, which the port cannot pass), so "
              "pad rows would change the video and its audio")

    def __init__(self, buckets: Sequence[int], native_length: int):
        self.native_length = int(native_length)

    def bucket_for(self, length: int) -> int:
        return int(length)

    def pad(self, text: TextEmbeds, bucket: int) -> TextEmbeds:
        if bucket == text.length == text.used_length():
            return text
        raise PaddingRefused(f"{self.name}: refusing to change the text length from {text.length} to {bucket}: "
                             f"{self.reason}")
