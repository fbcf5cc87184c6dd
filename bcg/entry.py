"""One captured signature: static input buffers, the captured forward and its static output.

Static-buffer rule (the invariant every replay relies on): the graph captured *addresses*. The
static inputs, the bridges between segments and the output are allocated once, at capture, and
are only ever written in place: live inputs are copied into the static inputs, breaks copy their
fresh results into their bridges, replay writes the output. None of them is ever reassigned,
resized or freed while the entry lives, and callers never get them: they get clones, so two calls
(the two CFG branches) never see each other's output. `check_buffers` verifies the addresses
(`RunnerConfig.debug_check_buffers` runs it on every replay).

Memo breaks (bcg.memo) keep their bridges across replays while their inputs are unchanged; the
entry's `InputSources` tells them which live inputs changed (noted before each replay's copy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .backend import Backend
from .graph import CapturedForward, MemoStep, capture_forward
from .memo import InputSources
from .signature import CallKey, rebuild, summarize
from .tree import clone_tree, tensor_leaves


@dataclass
class GraphEntry:
    key: CallKey
    static_inputs: list[torch.Tensor]
    graph: CapturedForward
    output: Any
    capture_seconds: float
    summary: str
    sources: InputSources | None = None
    addresses: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        self.addresses = tuple(t.data_ptr() for t in self._buffers())

    @property
    def nbytes(self) -> int:
        return self.graph.nbytes

    @property
    def segments(self) -> int:
        return self.graph.segments

    def _buffers(self) -> list[torch.Tensor]:
        return self.static_inputs + self.graph.bridge_tensors() + tensor_leaves(self.output)

    def replay(self, leaves: list[torch.Tensor], check: bool = False, scope: int | None = None) -> Any:
        """Copy the live tensor leaves in, replay, return a clone of the output. `scope`: the
        runner's call scope (bcg.memo: when inference tensors count as unchanged)."""
        if self.sources is not None:
            self.sources.note(leaves, scope)
        copy_into(self.static_inputs, leaves)
        if check:
            self.check_buffers()
        self.graph.replay()
        return clone_tree(self.output)

    def check_buffers(self) -> None:
        now = tuple(t.data_ptr() for t in self._buffers())
        if now != self.addresses:
            moved = sum(a != b for a, b in zip(now, self.addresses))
            raise RuntimeError(
                f"bcg: {moved} static buffer(s) of signature [{self.summary}] moved since capture; "
                "a graph would read or write freed memory. Something reassigned or resized a "
                "static input, bridge or output in place (set_, resize_, .data =)"
            )

    def describe(self) -> dict:
        return {
            "signature": self.summary,
            "segments": self.segments,
            "breaks": len(self.graph.breaks),
            "memo_breaks": sum(isinstance(b, MemoStep) for b in self.graph.breaks),
            "graph_bytes": self.nbytes,
            "capture_seconds": round(self.capture_seconds, 4),
        }


def copy_into(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """dst.copy_(src) for each pair; contiguous sources go in one fused multi-tensor copy, which
    costs the host about what one copy_ does (four separate copies cost ~38 µs a replay)."""
    fused_d, fused_s = [], []
    for dst, src in zip(dsts, srcs):
        if src.is_contiguous():
            fused_d.append(dst)
            fused_s.append(src)
        else:  # expanded timesteps and other views: the per-tensor path handles any layout
            dst.copy_(src)
    if len(fused_d) > 1:
        torch._foreach_copy_(fused_d, fused_s)
    elif fused_d:
        fused_d[0].copy_(fused_s[0])


def static_like(t: torch.Tensor) -> torch.Tensor:
    """An empty static buffer for live input `t`, with `t`'s strides where they describe a dense,
    non-overlapping layout (a contiguous tensor, a transposed or permuted view). A kernel may pick
    its path by layout, and two paths need not round alike (cuBLAS on LTX-2's transposed latents
    vs on a contiguous copy: 4 ulp apart), so the graph must compute on the layout eager saw; the
    key holds the strides, so every replay's input has them too. An overlapping input (an expanded
    timestep, stride 0 over a dimension of size > 1) cannot be written in place with its strides;
    it gets a contiguous buffer, the same values at every index."""
    if _dense(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _dense(t: torch.Tensor) -> bool:
    """True when `t`'s elements tile one block of memory exactly once (any order of dimensions)."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _warmup_like(t: torch.Tensor) -> torch.Tensor:
    # Random, never zeros: zeros can steer a model down a branch (or a kernel choice) that the
    # real inputs never take. Integer/bool tensors (masks, ids) keep their live values.
    if t.is_floating_point() or t.is_complex():
        return torch.randn(t.shape, dtype=t.dtype, device=t.device)
    return t


def capture_entry(
    fn: Callable, args: tuple, kwargs: dict, key: CallKey, leaves: list[torch.Tensor],
    backend: Backend, warmup_iters: int, counters: Any = None, scope: int | None = None,
) -> tuple[GraphEntry, Any]:
    """Warm up, capture `fn(*args, **kwargs)` with static buffers; returns the entry and this
    call's output (a clone, computed by the capture itself). `counters` (memo runs and reuses)
    and `scope` (the runner's call scope) serve memo breaks."""
    t0 = time.perf_counter()
    # Copies allocated before the capture: outside the graph pool, fixed addresses.
    static = [static_like(t).copy_(t) for t in leaves]
    s_args, s_kwargs = rebuild(args, kwargs, static)
    with backend.stream():
        for _ in range(warmup_iters):
            w_args, w_kwargs = rebuild(args, kwargs, [_warmup_like(t) for t in leaves])
            fn(*w_args, **w_kwargs)
        recorder = backend.recorder()
        sources = InputSources(static, leaves, scope, counters)
        output, graph = capture_forward(lambda: fn(*s_args, **s_kwargs), recorder, sources)
        result = clone_tree(output)
    backend.synchronize()
    entry = GraphEntry(key, static, graph, output, time.perf_counter() - t0, summarize(key), sources)
    return entry, result
