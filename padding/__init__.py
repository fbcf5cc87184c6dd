"""Per-family text padding policies (see padding/base.py for the contract)."""

from padding import bucket as _bucket  # noqa: F401  (registers "sana")
from padding import glm_image as _glm_image  # noqa: F401  (registers "glm_image")
from padding import ltx2 as _ltx2  # noqa: F401  (registers "ltx2")
from padding import minimax_h3 as _minimax_h3  # noqa: F401  (registers "minimax_h3")
from padding import passthrough as _passthrough  # noqa: F401  (registers "flux", "longcat_image", "wan")
from padding import qwen_image as _qwen_image  # noqa: F401  (registers "qwen_image")
from padding import sana_video as _sana_video  # noqa: F401  (registers "sana_video")
from padding import z_image as _z_image  # noqa: F401  (registers "z_image")
from padding.base import Padder, PaddingRefused, TextEmbeds
from padding.registry import get_padder, known_families, register_padder

__all__ = ["Padder", "PaddingRefused", "TextEmbeds", "get_padder", "known_families", "register_padder"]
