"""SANA-Video bucket padding: its 300-long Gemma text is masked, so it is re-cut to buckets as SANA's is.

What diffusers 0.42.1's `SanaVideoPipeline` does with the text (checked in pipeline_sana_video.py
and transformer_sana_video.py; tests/test_family_sana_video.py pins it):

- `encode_prompt` tokenizes every prompt to max_sequence_length (300), right-padded, and keeps
  the tokenizer's mask (with the complex-human-instruction prefix it keeps position 0 and the
  last 299 positions, as SANA does). Every prompt reaches the transformer at 300, so passing 300
  through would be lossless too.
- But the transformer takes that mask: `SanaVideoTransformer3DModel.forward` turns
  `encoder_attention_mask` into a -10000 additive bias, and its only text attention, the
  cross-attention (`SanaAttnProcessor2_0`, SDPA with that bias), gives masked keys a weight of
  exactly zero (exp(-10000) underflows in every dtype). Self-attention is linear attention over
  video tokens only, and the caption projection and norm act per token.

So the masked tail is inert, exactly as in SANA: cutting it to the smallest bucket that holds
every real token, or growing it with zero embeddings under mask 0, leaves the video unchanged up
to reduction order inside the attention kernel (tests: within float32 rounding, 1e-5), and saves
the cross-attention work of the padding. Buckets: model.text_buckets capped at 300.
"""

from __future__ import annotations

from padding.bucket import BucketPadder
from padding.registry import register_padder


@register_padder("sana_video")
class SanaVideoPadder(BucketPadder):
    name = "sana_video"
