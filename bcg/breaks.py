"""Breaks: functions that run eagerly between graph segments, and installing them on a model.

`eager_on_graph(fn)` marks a function that must not be captured (a variable-length attention
kernel, a collective, anything that reads tensors on the host). Outside a capture it calls `fn`
directly (one thread-local read); during a capture it ends the segment, runs `fn` once, records
a replay step and opens the next segment (`bcg.graph`).

`install_breaks(module, policy)` places breaks without editing model code, as a hook named
"bcg.break" on each target module (bcg/hooks.py; `remove_breaks` takes them off):

- "none": no breaks; the whole forward is one segment.
- "attention": every diffusers attention module (`Attention`, `AttentionModuleMixin`). The break
  is as narrow as it can be: only the attention kernel (`F.scaled_dot_product_attention`) called
  inside the module's forward runs eagerly; the q/k/v/out projections and the mask preparation
  stay in the graph. A naive break around the whole cross-attention module cost 9% at 512^2
  (ANCHORS.md); a kernel break adds one eager kernel and one bridge copy. Modules whose attention
  is plain matmuls (Sana's linear self-attention) call no kernel and stay captured whole, so
  SANA-1.6B gets 20 breaks (its 20 cross-attentions) and 21 segments.
- a list of names: modules whose qualified name (`transformer_blocks.3.attn2`) or class name
  (`SanaTransformerBlock`) matches; their whole forward becomes a break.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .config import BreakPolicy, validate_policy
from .graph import active_capture
from .hooks import Chain, count, remove_everywhere

log = logging.getLogger(__name__)

Fn = TypeVar("Fn", bound=Callable[..., Any])

_ATTENTION_KERNELS = frozenset({F.scaled_dot_product_attention})
HOOK = "bcg.break"


class _BreakHook:
    """The hook: `wrap` turns the forward beneath into a break of the policy's kind."""

    def __init__(self, make: Callable[[Callable], Callable]) -> None:
        self.make = make

    def wrap(self, module: nn.Module, inner: Callable) -> Callable:
        return self.make(inner)


def memo_on_graph(fn: Callable, params: Callable[[], list[torch.Tensor]]) -> Callable:
    """`fn` as a memo break (bcg/memo.py: re-run on replay only when its inputs changed); `params()`
    lists the weights `fn` reads."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cap = active_capture()
        if cap is None:
            return fn(*args, **kwargs)
        return cap.run_memo(fn, args, kwargs, params())

    wrapper.__bcg_memo__ = True  # type: ignore[attr-defined]
    return wrapper


def eager_on_graph(fn: Fn) -> Fn:
    """Run `fn` eagerly between graph segments during capture and on every replay."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cap = active_capture()
        if cap is None:
            return fn(*args, **kwargs)
        return cap.run_break(fn, args, kwargs)

    wrapper.__bcg_break__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


class _AttentionKernelBreaks(TorchFunctionMode):
    """Turns attention-kernel calls into breaks; active only inside an attention module's forward
    while a capture runs, so eager calls pay nothing for it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ATTENTION_KERNELS:
            cap = active_capture()
            if cap is not None:
                return cap.run_break(func, args, kwargs)
        return func(*args, **kwargs)


def _attention_forward(forward: Callable) -> Callable:
    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if active_capture() is None:
            return forward(*args, **kwargs)
        with _AttentionKernelBreaks():
            return forward(*args, **kwargs)

    wrapper.__bcg_attention_break__ = True  # type: ignore[attr-defined]  # fusions may inline past it
    return wrapper


def _attention_classes() -> tuple[type, ...]:
    classes: list[type] = []
    try:
        from diffusers.models.attention_processor import Attention

        classes.append(Attention)
    except ImportError:
        pass
    try:
        from diffusers.models.attention import AttentionModuleMixin

        classes.append(AttentionModuleMixin)
    except ImportError:
        pass
    return tuple(classes)


def _named_targets(module: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    wanted = set(names)
    found = [(qname, sub) for qname, sub in module.named_modules() if qname in wanted or type(sub).__name__ in wanted]
    problem = unknown_names(module, names)
    if problem:
        raise ValueError(problem)
    return found


def unknown_names(module: nn.Module, names: list[str]) -> str:
    """'' when every name matches a submodule (qualified name or class name), else what is wrong
    and what would match (callers turn it into their own error type)."""
    wanted = set(names)
    matched: set[str] = set()
    for qname, sub in module.named_modules():
        matched.update({qname, type(sub).__name__} & wanted)
    unknown = sorted(wanted - matched)
    if not unknown:
        return ""
    classes = sorted({type(m).__name__ for m in module.modules()})
    return (f"bcg.break_policy names {unknown} match no module of {type(module).__name__}; use a "
            f"qualified name from named_modules() (e.g. {[n for n, _ in module.named_modules()][1:4]}) "
            f"or a class name (one of {classes})")


def install_breaks(module: nn.Module, policy: BreakPolicy) -> int:
    """Install the breaks of `policy` on `module`'s submodules; returns how many were installed.
    Re-installing replaces the previous policy."""
    validate_policy(policy)
    remove_breaks(module)
    if isinstance(policy, str) and policy == "none":
        return 0
    targets: list[nn.Module]
    make: Callable[[Callable], Callable]
    if isinstance(policy, str):  # "attention"
        classes = _attention_classes()
        # modules(): named_modules() without names, and typed (torch leaves named_modules unannotated)
        targets = [m for m in module.modules() if classes and isinstance(m, classes)]
        make = _attention_forward
        if not targets:
            log.warning("bcg: break_policy=attention found no diffusers attention module in %s",
                        type(module).__name__)
    else:
        targets = [m for _, m in _named_targets(module, list(policy))]
        make = eager_on_graph
    for sub in targets:
        Chain.of(sub).add(HOOK, _BreakHook(make))
    return len(targets)


def remove_breaks(module: nn.Module) -> int:
    """Undo `install_breaks`; returns how many breaks were removed."""
    return remove_everywhere(module, HOOK)


def count_breaks(module: nn.Module) -> int:
    return count(module, HOOK)


__all__ = ["eager_on_graph", "memo_on_graph", "install_breaks", "remove_breaks", "count_breaks"]
