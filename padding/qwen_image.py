"""Qwen-Image bucket padding: embeddings and mask, and with them the text rotary positions.

Qwen-Image's joint attention masks text padding (the processor turns `encoder_hidden_states_mask`
into a boolean SDPA mask over [text, image] keys), so padded text positions get exactly zero
attention weight and generic bucket padding is safe.

Host-side text length, as diffusers 0.42.1 has it: `QwenImageTransformer2DModel.forward` no longer
takes `txt_seq_lens`. The text half of the rotary table is sliced from a host int read off the
embeddings' shape (`compute_text_seq_len_from_mask` returns `encoder_hidden_states.shape[1]`;
`QwenEmbedRope.forward` slices `pos_freqs[max_vid_index : max_vid_index + that]`). Padding the
embeddings to the bucket therefore pads the text RoPE to the bucket as well: the real tokens keep
their positions (0..L-1 after the image offset) and the only host constant is the bucket. Nothing
else is derived from the prompt's length on the host: the per-sample lengths diffusers computes from
the mask stay on the device, and the attention mask itself is a graph input, copied from the live
mask on every replay. (A varlen attention backend would build `cu_seqlens` from that live mask
inside the attention call, with a host sync: such a backend needs `break_policy: [attention]`.)
`tests/test_family_qwen_image.py` pins these facts against the installed diffusers.
"""

from __future__ import annotations

from padding.bucket import BucketPadder
from padding.registry import register_padder


@register_padder("qwen_image")
class QwenImagePadder(BucketPadder):
    name = "qwen_image"
