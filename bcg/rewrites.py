"""Forward rewrites by quality tier: what `apply_graph_runner` installs under the graphs.

The core names the seam and knows no kernel: a tier's package registers its installer here
(`bcg.fusions` registers "lossless" when it is imported), and the runner looks the tier up. A
known tier's package is imported by name on its first lookup, so bcg's core never imports
bcg.fusions (nor Triton) until a model asks for that tier, and a tier nobody registered is
reported, not guessed.

    register_rewrite("lossless", install)     # install(module) -> Rewrite, or None with a log line
    rewrite_for("lossless")                   # the installer, or None
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol

from torch import nn


class Rewrite(Protocol):
    """Forwards a tier swapped on one model (through bcg.hooks), and what they did."""

    def stats(self) -> dict: ...

    def remove(self) -> int:
        """Restore every swapped forward; returns how many were restored."""


Installer = Callable[[nn.Module], "Rewrite | None"]

_INSTALLERS: dict[str, Installer] = {}
# The packages that register a tier when imported: named, not imported, so the core stays apart.
_PROVIDERS: dict[str, str] = {"lossless": "bcg.fusions"}


def register_rewrite(tier: str, install: Installer) -> None:
    if tier in _INSTALLERS and _INSTALLERS[tier] is not install:
        raise ValueError(f"a rewrite for tier {tier!r} is already registered (known: {sorted(_INSTALLERS)})")
    _INSTALLERS[tier] = install


def rewrite_for(tier: str) -> Installer | None:
    if tier not in _INSTALLERS and tier in _PROVIDERS:
        importlib.import_module(_PROVIDERS[tier])  # registers the tier
    return _INSTALLERS.get(tier)
