"""One way to wrap a module's forward: an ordered, removable chain of named hooks per module.

Everything bcg puts around a forward goes through here: the graph runner (on the transformer),
graph breaks (on attention modules, or modules named by the break policy) and the lossless
fusions (a block's fused forward; memo breaks ride inside them). Model code is never edited.

    chain = Chain.of(module)
    chain.add("bcg.break", hook)        # hook.wrap(module, inner) -> the forward to install
    chain.remove("bcg.break")           # any order: the rest of the chain stays as it was

A chain is rebuilt from its base whenever a hook comes or goes: base = the class's forward, or
an instance forward someone set before bcg's first hook; hooks[0] wraps the base, each later hook
wraps the one before (later = outer, as in diffusers' HookRegistry). Rebuilding, rather than
patching references in place, is what lets hooks leave in any order, and it hands every hook its
current inner forward: the graph runner re-binds to it (and drops graphs made from another), a
fusion's verifier can compare against it.

The forward installed is exactly what the outermost hook returned, so a check like
`"forward" in module.__dict__` still tells whether anything wraps the module. A forward replaced
by someone else after bcg's hooks (an offloading wrapper, say) is never overwritten: adding or
removing then raises, naming the module.
"""

from __future__ import annotations

from typing import Callable, Protocol

from torch import nn

_ATTR = "_bcg_hooks"


class Hook(Protocol):
    def wrap(self, module: nn.Module, inner: Callable) -> Callable:
        """The forward to install around `inner` (the forward beneath this hook)."""


class Replace:
    """A hook whose forward is made once and does not call the one beneath it (a fused forward);
    the forward beneath is kept as `inner` (what the fused one must equal)."""

    def __init__(self, forward: Callable) -> None:
        self.forward = forward
        self.inner: Callable | None = None

    def wrap(self, module: nn.Module, inner: Callable) -> Callable:
        self.inner = inner
        return self.forward


class Chain:
    """The hooks of one module, innermost first."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.base: Callable | None = module.__dict__.get("forward")  # someone else's, set before ours
        self.hooks: list[tuple[str, Hook]] = []
        self.installed: Callable | None = None

    @classmethod
    def of(cls, module: nn.Module) -> "Chain":
        chain = module.__dict__.get(_ATTR)
        if chain is None:
            chain = cls(module)
            object.__setattr__(module, _ATTR, chain)  # not a submodule, not a buffer: plain state
        return chain

    @staticmethod
    def find(module: nn.Module) -> "Chain | None":
        return module.__dict__.get(_ATTR)

    def names(self) -> list[str]:
        return [name for name, _ in self.hooks]

    def get(self, name: str) -> Hook | None:
        return next((hook for n, hook in self.hooks if n == name), None)

    def add(self, name: str, hook: Hook) -> Callable:
        """Wrap the module's current forward with `hook` (outermost); returns the installed forward."""
        if self.get(name) is not None:
            raise ValueError(f"{type(self.module).__name__} already has a hook named {name!r} "
                             f"(hooks: {self.names()}); remove it before adding another")
        self._check_untouched()
        self.hooks.append((name, hook))
        return self._rebuild()

    def remove(self, name: str) -> bool:
        """Take hook `name` out of the chain; False when there is none by that name."""
        if self.get(name) is None:
            return False
        self._check_untouched()
        self.hooks = [(n, h) for n, h in self.hooks if n != name]
        self._rebuild()
        return True

    def _check_untouched(self) -> None:
        current = self.module.__dict__.get("forward")
        if self.installed is not None and current is not self.installed:
            raise RuntimeError(f"{type(self.module).__name__}.forward was replaced after bcg's hooks "
                               f"{self.names()} were installed (another wrapper?); remove that wrapper first")

    def _rebuild(self) -> Callable:
        module = self.module
        forward = self.base if self.base is not None else type(module).forward.__get__(module)
        for _, hook in self.hooks:
            forward = hook.wrap(module, forward)
        if self.hooks:
            module.forward = forward
            self.installed = forward
            return forward
        # The last hook left: the module is as bcg found it.
        if self.base is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = self.base
        module.__dict__.pop(_ATTR, None)
        self.installed = None
        return forward


def remove_everywhere(root: nn.Module, name: str) -> int:
    """Remove hook `name` from `root` and every submodule; returns how many were removed."""
    removed = 0
    for sub in root.modules():
        chain = Chain.find(sub)
        if chain is not None and chain.remove(name):
            removed += 1
    return removed


def count(root: nn.Module, name: str) -> int:
    return sum(1 for sub in root.modules() if (c := Chain.find(sub)) is not None and c.get(name) is not None)
