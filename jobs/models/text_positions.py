"""How many text positions a text encoder can take, from its config alone (no weights).

An encoder with learned absolute positions (BERT and its kin, CLIP's text tower) holds a table of
`max_position_embeddings` rows (BERT a token-type buffer of that length too): a longer input cannot
run (the tiny SANA's MiniLM at 600: "The expanded size of the tensor (600) must match the existing size
(512)", after the model loaded). Relative positions (T5, UMT5) and rotary ones (Gemma, Qwen, Llama)
have no such table: they run at any length, `max_position_embeddings` being only what they were
trained at, so no limit is claimed for them.

A config is a checkpoint's `config.json` (its `model_type`) or a tiny preset's encoder section (its
`class_name`).
"""

from __future__ import annotations

import os
from typing import Optional

# model_type -> positions the table spends before the first token (RoBERTa counts from pad_token_id + 1)
_ABSOLUTE = {"bert": False, "electra": False, "distilbert": False, "clip_text_model": False,
             "roberta": True, "xlm-roberta": True}
_CLASSES = {"BertModel": "bert", "ElectraModel": "electra", "DistilBertModel": "distilbert",
            "CLIPTextModel": "clip_text_model", "CLIPTextModelWithProjection": "clip_text_model",
            "RobertaModel": "roberta", "XLMRobertaModel": "xlm-roberta"}


def position_limit(config: dict) -> Optional[int]:
    """The most text positions an encoder of this config can take; None where it has no hard limit (or the
    config does not say)."""
    kind = config.get("model_type") or _CLASSES.get(str(config.get("class_name", "")))
    n = config.get("max_position_embeddings")
    if kind not in _ABSOLUTE or not isinstance(n, int):
        return None
    return n - (int(config.get("pad_token_id") or 0) + 1 if _ABSOLUTE[kind] else 0)


def encoder_config(folder: str) -> Optional[dict]:
    """A transformers folder's config.json, or None where it has none."""
    from jobs.models.checkpoint import read_json

    path = os.path.join(folder, "config.json")
    return read_json(path) if os.path.isfile(path) else None
