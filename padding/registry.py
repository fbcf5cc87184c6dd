"""Padders by model-family name. Unknown names list the known ones; duplicates raise."""

from __future__ import annotations

from typing import Callable, Dict

from padding.base import Padder

_REGISTRY: Dict[str, Callable[..., Padder]] = {}


def register_padder(family: str):
    def deco(factory: Callable[..., Padder]):
        if family in _REGISTRY:
            raise ValueError(f"padder for family {family!r} is already registered")
        _REGISTRY[family] = factory
        return factory

    return deco


def get_padder(family: str, **options) -> Padder:
    if family not in _REGISTRY:
        raise ValueError(
            f"model.family={family!r} has no padding policy; known families: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[family](**options)


def known_families() -> list[str]:
    return sorted(_REGISTRY)
