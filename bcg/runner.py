"""`GraphRunner`: wraps a module's forward; each call is a replay, a capture or an eager miss.

    hit      signature captured: copy live tensors into static buffers, replay, return a clone
    capture  first sight of a signature while `capture_allowed` and the caps permit: warm-up on
             random data, capture, return this call's result from the graph
    miss     otherwise: run eager, count it, log once per signature what differs from the
             nearest captured signature

`apply_graph_runner(module, config)` patches `module.forward` (an instance attribute) so that
diffusers pipelines call the transformer unchanged; `runner.remove()` restores it. Without CUDA
(backend "auto") the runner steps aside with one log line: every call runs eager, uncounted.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import nn

from .backend import Backend, resolve_backend
from .breaks import install_breaks, remove_breaks
from .config import RunnerConfig
from .counters import Counters
from .entry import GraphEntry, capture_entry
from .signature import Key, describe_difference, flatten, summarize

log = logging.getLogger(__name__)


class GraphRunner:
    def __init__(
        self, fn: Callable, config: RunnerConfig | None = None, *,
        device: torch.device | None = None, name: str = "forward",
    ) -> None:
        self.fn = fn
        self.config = config or RunnerConfig()
        self.name = name
        self.backend: Backend | None
        self.backend, self.reason = resolve_backend(self.config, device)
        self.mode = self.backend.name if self.backend is not None else (
            "eager" if self.config.enabled else "disabled")
        self.capture_allowed = True
        # The caller's capture policy declined this signature (it would not pay): run eager
        # quietly, counted as `declined`, not as a miss.
        self.bypass = False
        # Held around a capture: the caller's other threads take it before enqueueing GPU work,
        # which CUDA forbids from other threads while a global-mode capture is under way.
        self.capture_lock: Any = contextlib.nullcontext()
        self.counters = Counters()
        self.breaks_installed = 0
        self.fusions: Any = None  # bcg.fusions.Fusions when the lossless tier is installed
        self._entries: OrderedDict[Key, GraphEntry] = OrderedDict()  # LRU order: oldest first
        self._eager_keys: set[Key] = set()  # failed or over the memory bound: eager for good
        self._logged: set[Key] = set()
        self._scope: int | None = None  # the open call_scope's number (bcg.memo)
        self._scopes = 0
        self._module: nn.Module | None = None
        log.info("bcg: %s runs %s (%s)", name,
                 "as graphs" if self.backend else "eager", self.reason)

    # -- the call path -------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.backend is None:
            return self.fn(*args, **kwargs)
        if self.bypass:
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
            self._miss(key, "its capture failed or exceeded bcg.max_graph_bytes")
        elif not self.capture_allowed:
            self._miss(key, "capture is not allowed now (runner.capture_allowed=False)")
        else:
            out = self._capture(key, args, kwargs, leaves)
            if out is not _FAILED:
                return out
        return self.fn(*args, **kwargs)

    def _capture(self, key: Key, args: tuple, kwargs: dict, leaves: list) -> Any:
        assert self.backend is not None
        while len(self._entries) >= self.config.max_entries:
            self._evict_oldest()
        try:
            with self.capture_lock:
                entry, out = capture_entry(self.fn, args, kwargs, key, leaves, self.backend,
                                           self.config.warmup_iters, self.counters, self._scope)
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

    def _enforce_bytes(self, newest: Key) -> None:
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
            log.warning("bcg: [%s] needs %.1f MiB of graph memory, over bcg.max_graph_bytes=%d; "
                        "it runs eager", entry.summary, entry.nbytes / 2**20, cap)
            assert self.backend is not None
            self.backend.released()

    def _evict_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.counters.graph_bytes -= entry.nbytes
        self.counters.evictions += 1

    def _miss(self, key: Key, why: str) -> None:
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
    def call_scope(self):
        """One pipeline call (all its denoising steps). Inside it, an inference tensor passed
        again as the same object counts as unchanged, so memo breaks (bcg.memo) reuse what they
        made from it; tensors with a version counter are checked by version, scope or not. The
        caller promises not to edit such inputs in place during the call (diffusers pipelines
        do not: they pass the same prompt embeddings to every step)."""
        self._scopes += 1
        outer, self._scope = self._scope, self._scopes
        try:
            yield self
        finally:
            self._scope = outer

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
        """Restore the module's forward, remove its breaks and free every graph."""
        self.release_all()
        module, self._module = self._module, None
        if module is None:
            return
        if module.__dict__.get("forward") is self:
            del module.__dict__["forward"]
        remove_breaks(module)
        if self.fusions is not None:
            self.fusions.remove()

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


def _install_fusions(module: nn.Module):
    from .fusions import install_fusions, triton_available

    why = triton_available()
    if why is not None:
        log.warning("bcg: fusions=lossless needs Triton (%s); the model keeps its own forward", why)
        return None
    return install_fusions(module, backend="triton")


def apply_graph_runner(module: nn.Module, config: RunnerConfig | None = None) -> GraphRunner:
    """Route `module`'s calls through a `GraphRunner` (and install its breaks); returns it."""
    config = config or RunnerConfig()
    if "forward" in module.__dict__:
        raise RuntimeError(
            f"{type(module).__name__} already has an instance-level forward (a GraphRunner or "
            "another wrapper); call .remove() on that runner before applying a new one"
        )
    forward = module.forward
    if config.tier == "fast" and config.enabled and config.backend != "eager":
        from .compiled import compiled_forward

        forward = compiled_forward(forward, config.break_policy)
    runner = GraphRunner(forward, config, device=_module_device(module), name=type(module).__name__)
    if runner.backend is not None:
        runner.breaks_installed = install_breaks(module, config.break_policy)
    if config.tier == "lossless" and runner.mode == "cuda":
        runner.fusions = _install_fusions(module)
    module.forward = runner
    runner._module = module
    return runner
