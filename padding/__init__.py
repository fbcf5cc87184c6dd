"""Per-family text padding policies (see padding/base.py for the contract)."""

from padding.base import Padder, PaddingRefused, TextEmbeds
from padding.registry import get_padder, known_families, register_padder
from padding import bucket as _bucket  # noqa: F401  (registers "sana")

__all__ = ["Padder", "PaddingRefused", "TextEmbeds", "get_padder", "known_families", "register_padder"]
