"""Memo breaks: work whose inputs stay the same through a pipeline call runs once, not every step.

A diffusers pipeline passes the same prompt embeddings to every denoising step, so whatever a model
computes from them alone is the same at every step (SANA: the caption projection and each block's
cross-attention K and V, 42 GEMMs a forward). `memo_on_graph(fn, params)` marks such a function:

- outside a capture it is `fn` (an eager forward computes it every call);
- during a capture it is a break (bcg.graph; the decorator lives with `eager_on_graph` in
  bcg.breaks): `fn` runs eagerly once and its outputs become bridges; on replay its step
  (`bcg.graph.MemoStep`) re-runs `fn` only when the live tensor behind one of its inputs changed
  since its last run, or one of `params` was edited in place. Otherwise the bridges keep the last
  results, which are the bits `fn` would make again (same calls, same inputs).

Which live inputs changed is the entry's `InputSources`. Every live input is still copied into its
static buffer on every replay (so nothing else about replay changes); for the static inputs a memo
reads, the entry also notes whether the live tensor is the one it saw last time, unedited:

- the same object (a weak reference, so no id reuse) and the same version counter;
- inference tensors (torch.inference_mode) have no version counter: the same object counts as
  unchanged only inside `GraphRunner.call_scope()` (the job opens one around each batch's denoise):
  the caller's promise that it does not edit them in place during the call. Outside a scope an
  inference tensor counts as changed on every call, so the memo re-runs: slower, never stale.

A memo's tensor arguments must be static inputs themselves (the model's arguments, as passed). A
memo fed by anything the graph computed cannot know when that changed: it runs as a plain break
(every replay), logged once. Contract for `fn`: its result depends only on its tensor arguments
and `params` (module weights; an in-place edit bumps their version, so it re-runs).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Sequence

import torch

from .tree import tensor_leaves

log = logging.getLogger(__name__)


def version(t: torch.Tensor) -> int | None:
    """A tensor's in-place edit counter; None for inference tensors, which have none."""
    return None if t.is_inference() else t._version


class InputSources:
    """One entry's static inputs and, for those a memo reads, a generation number that moves
    whenever the live tensor copied in is not the one copied last time, unedited."""

    def __init__(self, static: Sequence[torch.Tensor], live: Sequence[torch.Tensor], scope: int | None,
                 counters: Any = None) -> None:
        self.static = list(static)
        self.counters = counters  # the runner's Counters (memo_runs / memo_reuses), or None
        self.generation = [0] * len(self.static)
        self._captured = [_source(t, scope) for t in live]  # what each static input was filled from
        self._watched: dict[int, tuple] = {}  # static index -> (weakref, version, scope) of its last source

    def index_of(self, t: torch.Tensor) -> int | None:
        return next((i for i, s in enumerate(self.static) if s is t), None)

    def watch(self, i: int) -> None:
        """Track static input i from now on (a memo reads it)."""
        self._watched.setdefault(i, self._captured[i])

    def note(self, leaves: Sequence[torch.Tensor], scope: int | None) -> None:
        """Before a replay copies `leaves` in: move the generation of each watched input whose
        live tensor is new or edited."""
        for i, (ref, ver, sc) in self._watched.items():
            live = leaves[i]
            if ref() is live and (ver == version(live) if ver is not None else scope is not None and sc == scope):
                continue
            self.generation[i] += 1
            self._watched[i] = _source(live, scope)


def _source(live: torch.Tensor, scope: int | None) -> tuple:
    return weakref.ref(live), version(live), scope


_logged: set[str] = set()


def memo_inputs(sources: InputSources | None, fn: Callable, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The static-input indices of a memo's tensor arguments, or None (with one log line per
    function) when one of them is not a static input, or the capture has no sources."""
    tensors = tensor_leaves((args, kwargs))
    found = [sources.index_of(t) for t in tensors] if sources is not None else [None]
    if tensors and None not in found:
        return tuple(i for i in found if i is not None)  # all of them (the test above)
    name = getattr(fn, "__qualname__", repr(fn))
    if name not in _logged:
        _logged.add(name)
        log.warning("bcg: memo %s reads a tensor that is not one of the forward's inputs (or no "
                    "inputs are tracked); it re-runs on every replay like a plain break", name)
    return None
