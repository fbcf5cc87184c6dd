"""Prompt embeddings for training, as SanaPipeline.encode_prompt makes them at inference.

The pipeline lower-cases and strips the prompt, tokenizes it right-padded to
max_sequence_length (300) with truncation and special tokens, and takes the encoder's last hidden
state; without a complex human instruction its select index keeps all 300 positions. Here the
batch is padded only to its longest prompt: BERT masks padded keys, so the real positions come
out the same (up to reduction order), and SANA's cross-attention masks the tail either way
(tests/test_demo.py compares this against the pipeline's own encode_prompt).
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

MAX_SEQUENCE_LENGTH = 300


def tokenize(tokenizer, prompts: Sequence[str],
             max_length: int = MAX_SEQUENCE_LENGTH) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), [B, L] with L the longest prompt (at most max_length)."""
    tokenizer.padding_side = "right"
    out = tokenizer([p.lower().strip() for p in prompts], padding="longest", max_length=max_length,
                    truncation=True, add_special_tokens=True, return_tensors="pt")
    return out.input_ids, out.attention_mask


@torch.no_grad()
def encode(text_encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L, D] last hidden state, as the pipeline's `text_encoder(ids, attention_mask=mask)[0]`."""
    return text_encoder(input_ids, attention_mask=attention_mask)[0]
