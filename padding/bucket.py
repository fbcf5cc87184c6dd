"""Generic bucket padding (SANA and every model whose attention masks text padding).

The pipeline encodes to its native length (SANA: 300, right-padded, masked). `pad` re-cuts the
embeddings to the bucket: the masked tail it drops is wasted cross-attention work, and growing a
short sequence appends zero embeddings with mask 0. Attention adds a large negative bias at mask 0,
so softmax gives those positions exactly zero weight and the real tokens' outputs do not change
(up to reduction order inside the attention kernel, which may differ between key lengths).
"""

from __future__ import annotations

from typing import Sequence

from padding.base import Padder, TextEmbeds
from padding.registry import register_padder


def effective_buckets(buckets: Sequence[int], native_length: int) -> list[int]:
    """Buckets above the native length would only add masked slots: cap them at the native length."""
    kept = sorted({int(b) for b in buckets if int(b) < native_length})
    return kept + [int(native_length)]


class BucketPadder(Padder):
    masks_padding = True

    def __init__(self, buckets: Sequence[int], native_length: int):
        self.buckets = effective_buckets(buckets, native_length)
        self.native_length = int(native_length)

    def bucket_for(self, length: int) -> int:
        for b in self.buckets:
            if length <= b:
                return b
        # Longer than every bucket (only possible when the encoder does not truncate): keep the
        # length; that signature runs eager unless it is captured too.
        return int(length)

    def pad(self, text: TextEmbeds, bucket: int) -> TextEmbeds:
        length = text.length
        if bucket == length:
            return text
        if text.mask is None:
            raise ValueError(f"{self.name}: cannot re-bucket text embeddings without an attention mask")
        if bucket < length:
            assert not text.mask[:, bucket:].any(), (
                f"bucket {bucket} would cut real tokens (used length {text.used_length()})"
            )
            return text.cut(bucket)
        return text.grown(bucket)


@register_padder("sana")
class SanaPadder(BucketPadder):
    name = "sana"
