"""Forward rewrites by quality tier: what `apply_graph_runner` installs under the graphs.

The core names the seam and knows no kernel: a tier's package registers its installer here
(`bcg.fusions` registers "lossless" when it is imported, which `import bcg` does), and the runner
looks the tier up. So bcg's core never imports bcg.fusions, and a tier nobody registered is
reported, not guessed.

    register_rewrite("lossless", install)     # install(module) -> Rewrite, or None with a log line
    rewrite_for("lossless")                   # the installer, or None
"""

from __future__ import annotations

from typing import Callable, Protocol

from torch import nn


class Rewrite(Protocol):
    """Forwards a tier swapped on one model (through bcg.hooks), and what they did."""

    def stats(self) -> dict: ...

    def remove(self) -> int:
        """Restore every swapped forward; returns how many were restored."""


Installer = Callable[[nn.Module], "Rewrite | None"]

_INSTALLERS: dict[str, Installer] = {}


def register_rewrite(tier: str, install: Installer) -> None:
    if tier in _INSTALLERS and _INSTALLERS[tier] is not install:
        raise ValueError(f"a rewrite for tier {tier!r} is already registered (known: {sorted(_INSTALLERS)})")
    _INSTALLERS[tier] = install


def rewrite_for(tier: str) -> Installer | None:
    return _INSTALLERS.get(tier)
