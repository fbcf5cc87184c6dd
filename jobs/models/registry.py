"""Model families by name; unknown names list the known ones."""

from __future__ import annotations

from typing import Dict

from jobs.errors import UserError
from jobs.models.base import ModelFamily

_FAMILIES: Dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    _FAMILIES[family.name] = family
    return family


def get_family(name: str) -> ModelFamily:
    _load_builtin()
    if name not in _FAMILIES:
        raise UserError(f"model.family={name!r} is unknown; known families: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]


def known_families() -> list[str]:
    _load_builtin()
    return sorted(_FAMILIES)


def _load_builtin() -> None:
    # Imported lazily so `jobs.config` validation never pays for diffusers imports.
    from jobs.models import (  # noqa: F401
        flux,
        glm_image,
        longcat_image,
        ltx2,
        minimax_h3,
        qwen_image,
        sana,
        sana_video,
        wan,
        z_image,
    )
