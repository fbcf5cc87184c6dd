"""A captured forward: graph segments with eager breaks between them, and how it is captured.

    capture:  begin seg0 ... [break: end seg0, run fn eagerly, begin seg1] ... end segN
    replay:   seg0, break0, seg1, ..., segN          (one loop, no Python between the lines)

A break's output tensors are *bridges*: the next segment captured their addresses, so they are
held strongly by the `BreakStep` (a weak reference once let a peer's bridge be freed and reused,
a segfault) and each replay copies the fresh eager result into them. The break's inputs are held
too: they are graph-pool tensors of the previous segment, and freeing them would let a later
segment of the same pool reuse their memory while the break still reads it.

A memo break (`bcg.memo`) is a break whose replay step re-runs its function only when its inputs
changed since its last run (the prompt embeddings, passed unchanged through a pipeline call).

Capture state is thread-local and cleared in try/finally; starting a capture while one is active
on the thread raises. Backends (`bcg.backend`) record the segments: CUDA graphs on GPU, an aten
op tape on CPU for tests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .backend import Recorder, Step
from .memo import InputSources, memo_inputs, version
from .tree import tensor_leaves

_state = threading.local()


def active_capture() -> "_Capture | None":
    """The capture running on this thread, or None (the common, fast case)."""
    return getattr(_state, "capture", None)


@dataclass
class BreakStep:
    """An eager call between two segments, re-run on every replay."""

    fn: Callable
    args: tuple
    kwargs: dict
    bridges: list[torch.Tensor]

    def replay(self) -> None:
        fresh = self.fn(*self.args, **self.kwargs)
        for dst, src in zip(self.bridges, tensor_leaves(fresh)):
            if src is not dst:
                dst.copy_(src)


@dataclass
class MemoStep(BreakStep):
    """A break re-run on replay only when its inputs' generations or its params' versions moved
    (bcg.memo); otherwise its bridges keep the last results."""

    sources: InputSources
    inputs: tuple[int, ...]
    params: list[torch.Tensor]
    last: tuple = field(init=False)

    def __post_init__(self) -> None:
        self.last = self._state()

    def _state(self) -> tuple:
        return (tuple(self.sources.generation[i] for i in self.inputs), tuple(version(p) for p in self.params))

    def replay(self) -> None:
        state = self._state()
        counters = self.sources.counters
        if state == self.last:
            if counters is not None:
                counters.memo_reuses += 1
            return
        super().replay()
        self.last = state
        if counters is not None:
            counters.memo_runs += 1


@dataclass
class CapturedForward:
    """The steps of one captured call, replayed in capture order."""

    steps: list[Step]
    nbytes: int = 0
    owner: Any = None  # the recorder: its pool and keep-alive references live as long as we do
    breaks: list[BreakStep] = field(init=False)

    def __post_init__(self) -> None:
        self.breaks = [s for s in self.steps if isinstance(s, BreakStep)]  # memo breaks too

    @property
    def segments(self) -> int:
        return len(self.steps) - len(self.breaks)

    def replay(self) -> None:
        for step in self.steps:
            step.replay()

    def bridge_tensors(self) -> list[torch.Tensor]:
        return [t for b in self.breaks for t in b.bridges]


class _Capture:
    def __init__(self, recorder: Recorder, sources: InputSources | None) -> None:
        self.recorder = recorder
        self.sources = sources
        self.steps: list[Step] = []
        self.segment_open = False

    def begin(self) -> None:
        self.recorder.begin()
        self.segment_open = True

    def end(self) -> None:
        self.segment_open = False
        self.steps.append(self.recorder.end())

    def run_break(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """End the segment, run `fn` eagerly once, record it, open the next segment."""
        out = self._eager(fn, args, kwargs)
        self.steps.append(BreakStep(fn, args, dict(kwargs), tensor_leaves(out)))
        self.begin()
        return out

    def run_memo(self, fn: Callable, args: tuple, kwargs: dict, params: list[torch.Tensor]) -> Any:
        """A break whose replay re-runs `fn` only when its inputs changed (bcg.memo); a plain
        break when one of its tensor arguments is not a static input."""
        inputs = memo_inputs(self.sources, fn, args, kwargs)
        if inputs is None:
            return self.run_break(fn, args, kwargs)
        assert self.sources is not None  # memo_inputs gives None without sources
        out = self._eager(fn, args, kwargs)
        for i in inputs:
            self.sources.watch(i)
        self.steps.append(MemoStep(fn, args, dict(kwargs), tensor_leaves(out), self.sources, inputs, list(params)))
        self.begin()
        return out

    def _eager(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        self.end()
        # Breaks inside `fn` are already eager: hide the capture while it runs.
        _state.capture = None
        try:
            return fn(*args, **kwargs)
        finally:
            _state.capture = self


def capture_forward(call: Callable[[], Any], recorder: Recorder,
                    sources: InputSources | None = None) -> tuple[Any, CapturedForward]:
    """Capture `call()` as segments; returns its output (valid: backends run what they record).
    `sources`: the static inputs `call` reads, for memo breaks (without it they are plain breaks)."""
    if active_capture() is not None:
        raise RuntimeError("bcg: a capture is already running on this thread; captures do not nest")
    cap = _Capture(recorder, sources)
    _state.capture = cap
    try:
        cap.begin()
        try:
            out = call()
            cap.end()
        except BaseException:
            if cap.segment_open:
                recorder.abort()
            raise
    finally:
        _state.capture = None
    return out, CapturedForward(cap.steps, recorder.nbytes(), recorder)
