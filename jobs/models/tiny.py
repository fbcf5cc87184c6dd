"""Builders for the tiny presets' random components, from their yaml `tiny:` sections.

Tiny presets use the real diffusers and transformers classes in tiny seeded random configs; the
tokenizers are real and offline (MiniLM's WordPiece, see text_encoders.py).
"""

from __future__ import annotations

from jobs.errors import UserError
from jobs.models import text_encoders


def tiny_tokenizer(spec: dict):
    """A fresh offline tokenizer (`spec.tokenizer`: 'minilm' or a local folder), adjusted per preset."""
    from transformers import AutoTokenizer

    path = text_encoders.resolve_encoder_path(spec["tokenizer"])
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True, **dict(spec.get("tokenizer_kwargs") or {}))
    if spec.get("chat_template"):
        tok.chat_template = spec["chat_template"]
    return tok


def tiny_text_encoder(spec: dict):
    """A seeded random instance of the real encoder class (`spec.class_name`) from `spec.config`."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cls = getattr(transformers, spec["class_name"], None)
    if cls is None:
        raise UserError(f"model.tiny.text_encoder.class_name={spec['class_name']!r} is not a transformers class; "
                         f"use e.g. Qwen2_5_VLForConditionalGeneration, Qwen3Model, T5EncoderModel")
    config = cls.config_class(**dict(spec["config"]))
    return cls(config).eval()


def build_scheduler(spec: dict):
    import diffusers

    spec = dict(spec)
    return getattr(diffusers, spec.pop("class_name"))(**spec)
