"""`GraphRunner`: wraps a module's forward; each call is a replay, a capture or an eager run.

What a call may do is the caller's decision (`Dispatch`), one value per pipeline call, made by
the caller's dispatcher (the job's is jobs/worker/dispatcher.py); the runner carries it out:

    CAPTURE  hit: copy live tensors into static buffers, replay, return a clone; first sight of a
             signature (within the caps): warm-up on random data, capture, return this call's
             result from the graph (`warmup="live"`: the signature's first `warmup_iters` calls
             run eager as the warm-up, and the next one captures)
    REPLAY   hit: replay; first sight: run eager as a miss (counted, logged once per signature
             with what differs from the nearest captured one)
    EAGER    run eager, counted as `declined` (the caller chose it: no miss warning)

    runner = apply_graph_runner(pipe.transformer, config, break_policy="attention")
    with runner.call_scope(Dispatch.CAPTURE):   # one pipeline call: every denoising step
        images = pipe(...)

`apply_graph_runner` installs the tier's rewrites (bcg/rewrites.py), the breaks and the runner
through one hook chain per module (bcg/hooks.py), so diffusers pipelines call the transformer
unchanged; `runner.remove()` takes all of it off. Without CUDA (backend "auto") the runner steps
aside with one log line: every call runs eager, uncounted.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .backend import Backend, resolve_backend
from .breaks import install_breaks, remove_breaks
from .compiled import compiled_forward
from .config import BreakPolicy, RunnerConfig, validate_policy
from .counters import Counters
from .entry import GraphEntry, capture_entry
from .hooks import Chain
from .rewrites import Rewrite, rewrite_for
from .signature import CallKey, describe_difference, flatten, summarize

log = logging.getLogger(__name__)

HOOK = "bcg.graph_runner"


class Dispatch(enum.Enum):
    """What the runner may do with the calls of one pipeline call (module docstring)."""

    CAPTURE = "capture"
    REPLAY = "replay"
    EAGER = "eager"


class GraphRunner:
    def __init__(
        self, fn: Callable, config: RunnerConfig | None = None, *,
        device: torch.device | None = None, name: str = "forward", break_policy: BreakPolicy = "none",
    ) -> None:
        self.config = config or RunnerConfig()
        validate_policy(break_policy)
        self.break_policy = break_policy
        self._inner = fn  # the forward beneath the runner; `fn` is what it runs eagerly (maybe compiled)
        self.fn = self._compiled(fn)
        self.name = name
        self.backend: Backend | None
        self.backend, self.reason = resolve_backend(self.config, device)
        self.mode = self.backend.name if self.backend is not None else (
            "eager" if self.config.enabled else "disabled")
        # What calls outside a call_scope may do; a scope's dispatch overrides it for its calls.
        self.dispatch = Dispatch.CAPTURE
        # Held around a capture: the caller's other threads take it before enqueueing GPU work,
        # which CUDA forbids from other threads while a global-mode capture is under way.
        self.capture_lock: Any = contextlib.nullcontext()
        self.counters = Counters()
        self.breaks_installed = 0
        self.fusions: Rewrite | None = None  # the tier's rewrites (bcg/rewrites.py), when installed
        self._entries: OrderedDict[CallKey, GraphEntry] = OrderedDict()  # LRU order: oldest first
        self._eager_keys: set[CallKey] = set()  # failed or over the memory bound: eager for good
        self._warmed: dict[CallKey, int] = {}  # live warm-up calls run per signature (warmup="live")
        self._logged: set[CallKey] = set()
        self._scope: int | None = None  # the open call_scope's number (bcg.memo)
        self._scopes = 0
        self._scope_dispatch: Dispatch | None = None
        self._module: nn.Module | None = None
        log.info("bcg: %s runs %s (%s)", name,
                 "as graphs" if self.backend else "eager", self.reason)

    def _compiled(self, fn: Callable) -> Callable:
        if self.config.tier == "fast" and self.config.enabled and self.config.backend != "eager":
            return compiled_forward(fn, self.break_policy)
        return fn

    # -- the hook (bcg.hooks) --------------------------------------------------------------
    def wrap(self, module: nn.Module, inner: Callable) -> "GraphRunner":
        """Become `module`'s forward around `inner`. A rebuilt chain (a hook beneath came or went)
        hands a new inner forward: graphs captured from the old one no longer describe it."""
        if inner == self._inner:  # bound methods are made anew on every rebuild, and compare equal
            return self
        self.release_all()
        self._warmed.clear()  # the new forward's first sights are not those of the old one
        self._inner = inner
        self.fn = self._compiled(inner)
        return self

    # -- the call path -------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.backend is None:
            return self.fn(*args, **kwargs)
        dispatch = self._scope_dispatch or self.dispatch
        if dispatch is Dispatch.EAGER:
            self.counters.declined += 1
            return self.fn(*args, **kwargs)
        key, leaves = flatten(args, kwargs)
        if torch.is_grad_enabled():
            # A graph would drop autograd history; inference only.
            self._miss(key, "autograd is enabled (call under torch.no_grad())")
            return self.fn(*args, **kwargs)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.counters.hits += 1
            return entry.replay(leaves, self.config.debug_check_buffers, self._scope)
        if key in self._eager_keys:
            self._miss(key, "its capture failed or exceeded bcg.max_graph_memory_gb")
        elif dispatch is Dispatch.REPLAY:
            self._miss(key, "the caller's dispatch allows replay only (Dispatch.REPLAY)")
        elif self._warming(key):
            return self._warm_live(args, kwargs)
        else:
            out = self._capture(key, args, kwargs, leaves)
            if out is not _FAILED:
                return out
        return self.fn(*args, **kwargs)

    def _warming(self, key: CallKey) -> bool:
        """True while `key` still owes live warm-up calls (warmup="live") before its capture."""
        if self.config.warmup != "live" or self._warmed.get(key, 0) >= self.config.warmup_iters:
            return False
        self._warmed[key] = self._warmed.get(key, 0) + 1
        return True

    def _warm_live(self, args: tuple, kwargs: dict) -> Any:
        # On the stream the capture will use, as the random warm-up would run: workspaces that
        # cuBLAS keeps per stream are then made here, outside the graph.
        assert self.backend is not None
        self.counters.warmups += 1
        with self.backend.stream():
            return self.fn(*args, **kwargs)

    def _capture(self, key: CallKey, args: tuple, kwargs: dict, leaves: list) -> Any:
        assert self.backend is not None
        while len(self._entries) >= self.config.max_graphs:
            self._evict_oldest()
        try:
            warmups = 0 if self.config.warmup == "live" else self.config.warmup_iters
            with self.capture_lock:
                entry, out = capture_entry(self.fn, args, kwargs, key, leaves, self.backend,
                                           warmups, self.counters, self._scope)
        except Exception as exc:  # noqa: BLE001 - any failure makes this signature eager
            self._eager_keys.add(key)
            self._logged.add(key)  # this line is the one log line of the signature
            self.counters.capture_failures += 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            log.warning("bcg: capture failed for [%s] (%s: %s); this signature runs eager",
                        summarize(key), type(exc).__name__, first[:300])
            self.backend.released()
            self.counters.misses += 1
            return _FAILED
        c = self.counters
        c.captures += 1
        c.capture_seconds += entry.capture_seconds
        c.segments += entry.segments
        self._entries[key] = entry
        c.graph_bytes += entry.nbytes
        log.info("bcg: captured [%s]: %d segment(s), %.1f MiB, %.2f s", entry.summary,
                 entry.segments, entry.nbytes / 2**20, entry.capture_seconds)
        self._enforce_bytes(key)
        c.peak_graph_bytes = max(c.peak_graph_bytes, c.graph_bytes)
        return out

    def _enforce_bytes(self, newest: CallKey) -> None:
        cap = self.config.max_graph_bytes
        if cap <= 0:
            return
        while self.counters.graph_bytes > cap and len(self._entries) > 1:
            self._evict_oldest()
        if self.counters.graph_bytes > cap:
            entry = self._entries.pop(newest)
            self.counters.graph_bytes -= entry.nbytes
            self._eager_keys.add(newest)
            self._logged.add(newest)
            log.warning("bcg: [%s] needs %.1f MiB of graph memory, over bcg.max_graph_memory_gb=%g; "
                        "it runs eager", entry.summary, entry.nbytes / 2**20, self.config.max_graph_memory_gb)
            assert self.backend is not None
            self.backend.released()

    def _evict_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.counters.graph_bytes -= entry.nbytes
        self.counters.evictions += 1

    def _miss(self, key: CallKey, why: str) -> None:
        self.counters.misses += 1
        if key in self._logged:
            return
        self._logged.add(key)
        if self._entries:
            diffs = min((describe_difference(k, key) for k in self._entries), key=len)
            detail = "differs from the nearest captured signature in: " + "; ".join(diffs)
        else:
            detail = "no signature is captured"
        log.warning("bcg: signature MISSED [%s]: %s; running eager. %s",
                    summarize(key), why, detail)

    @contextlib.contextmanager
    def call_scope(self, dispatch: Dispatch | None = None) -> Iterator["GraphRunner"]:
        """One pipeline call (all its denoising steps), whose calls follow `dispatch` (None: the
        runner's `dispatch`). Inside it, an inference tensor passed again as the same object
        counts as unchanged, so memo breaks (bcg.memo) reuse what they made from it; tensors with
        a version counter are checked by version, scope or not. The caller promises not to edit
        such inputs in place during the call (diffusers pipelines do not: they pass the same
        prompt embeddings to every step)."""
        self._scopes += 1
        outer, self._scope = self._scope, self._scopes
        outer_dispatch, self._scope_dispatch = self._scope_dispatch, dispatch
        try:
            yield self
        finally:
            self._scope, self._scope_dispatch = outer, outer_dispatch

    # -- lifecycle -----------------------------------------------------------------------
    def release_all(self) -> None:
        """Free every graph (the job calls this when a sorted run of one signature ends)."""
        if not self._entries:
            return
        self._entries.clear()
        self.counters.graph_bytes = 0
        self.counters.releases += 1
        if self.backend is not None:
            self.backend.released()

    def remove(self) -> None:
        """Restore the module's forward, remove its breaks and rewrites and free every graph."""
        self.release_all()
        module, self._module = self._module, None
        if module is None:
            return
        Chain.of(module).remove(HOOK)
        remove_breaks(module)
        if self.fusions is not None:
            self.fusions.remove()
            self.fusions = None

    def entries(self) -> list[GraphEntry]:
        return list(self._entries.values())

    def stats(self) -> dict:
        """Counters and live entries, JSON-serializable."""
        d = {"mode": self.mode, "reason": self.reason, "breaks_installed": self.breaks_installed}
        d.update(self.counters.as_dict())
        d["live_entries"] = len(self._entries)
        d["fusions"] = self.fusions.stats() if self.fusions is not None else {"tier": self.config.tier}
        d["entries"] = [e.describe() for e in self._entries.values()]
        return d


_FAILED = object()


def _module_device(module: nn.Module) -> torch.device | None:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return None


def _install_rewrite(module: nn.Module, tier: str) -> Rewrite | None:
    install = rewrite_for(tier)
    if install is None:
        log.warning("bcg: no rewrite is registered for tier %r; the model keeps its own "
                    "forward", tier)
        return None
    return install(module)


def apply_graph_runner(module: nn.Module, config: RunnerConfig | None = None,
                       break_policy: BreakPolicy = "none") -> GraphRunner:
    """Route `module`'s calls through a `GraphRunner`, with the tier's rewrites (on CUDA) and the
    breaks of `break_policy` beneath it; returns the runner."""
    config = config or RunnerConfig()
    if "forward" in module.__dict__:
        raise RuntimeError(
            f"{type(module).__name__} already has an instance-level forward (a GraphRunner or "
            "another wrapper); call .remove() on that runner before applying a new one"
        )
    runner = GraphRunner(type(module).forward.__get__(module), config, device=_module_device(module),
                         name=type(module).__name__, break_policy=break_policy)
    if runner.backend is not None:
        runner.breaks_installed = install_breaks(module, break_policy)
    if config.tier == "lossless" and runner.mode == "cuda":
        runner.fusions = _install_rewrite(module, config.tier)
    runner._module = module
    Chain.of(module).add(HOOK, runner)
    return runner
