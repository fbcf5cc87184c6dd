"""Z-Image: keep every caption at its native length; equal lengths share a graph.

How diffusers 0.42.1 pads Z-Image captions (checked in `pipeline_z_image.py` and
`transformer_z_image.py`): the pipeline tokenizes to max_length, runs the text encoder, then keeps
only the real tokens, handing the transformer a list of per-prompt tensors `[L_i, D]`. Inside
`forward`, `patchify_and_embed` pads each caption to the next multiple of 32 (SEQ_MULTI_OF), then
`_prepare_sequence` overwrites the pad rows with the learned `cap_pad_token` and gives them rope
position 0. No mask hides them: the context refiner and the main layers attend to those pad tokens.

Two consequences:
- Any padding we add changes the image. Appending rows makes them real tokens (their own features
  and positions 1+i instead of `cap_pad_token` at position 0); the field notes measured bucket
  padding at 21 dB PSNR on the real model. This padder never changes what the model sees.
- The graph key sees `L_i` itself: the transformer's input is the unpadded `[L_i, D]`, so captions
  of 40 and 50 tokens (both 64 inside the model) are two different signatures. The bucket is
  therefore the exact native caption length: `bucket_for(n) == n`, and equal lengths share a graph.

The family (`jobs/models/z_image.py`) carries a batch as `[B, S, D]` plus a mask of each row's real
tokens, and hands the pipeline `embeds[i][mask[i]]`, exactly the pipeline's own list. So `pad()` may
re-cut the *storage* to the bucket with mask-0 columns (with CFG the negative, shorter than the
bucket, arrives here too): those columns are dropped before the transformer, and every row keeps
its native caption. A request that would cut real tokens, or text without a mask, is refused.
"""

from __future__ import annotations

from typing import Sequence

from padding.base import Padder, PaddingRefused, TextEmbeds
from padding.registry import register_padder


@register_padder("z_image")
class ZImagePadder(Padder):
    name = "z_image"
    masks_padding = False

    def __init__(self, buckets: Sequence[int], native_length: int):
        # Buckets do not apply (see the module docstring): the bucket is the native length.
        self.native_length = int(native_length)

    def bucket_for(self, length: int) -> int:
        return int(length)

    def pad(self, text: TextEmbeds, bucket: int) -> TextEmbeds:
        if text.mask is None:
            raise PaddingRefused(f"{self.name}: text without a mask has no native caption lengths to keep")
        used = text.used_length()
        if bucket < used:
            raise PaddingRefused(
                f"{self.name}: bucket {bucket} would cut real caption tokens (used length {used}); Z-Image attends "
                f"to every caption token, so its captions keep their native length")
        if bucket == text.length:
            return text
        if bucket < text.length:  # only mask-0 storage columns go
            return text.cut(bucket)
        return text.grown(bucket)
