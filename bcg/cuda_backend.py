"""CUDA graph segments: the product path.

All segments of one captured forward share one private memory pool (`graph_pool_handle`), so a
tensor freed in segment k can back a tensor of segment k+1; that is safe because replay runs the
segments in capture order on one stream. Each entry gets its own pool, so evicting an entry frees
its memory.

`end()` replays the segment it just captured: capture records kernels without running them, and
the break that follows must read real values (a break may even look at them on the host).

Caches that a graph reads (RoPE tables, attention metadata built before the capture) must outlive
the graph, or the graph reads freed memory after the module drops them. A dispatch mode watches
each captured op and keeps a strong reference to every tensor argument that was not produced
inside this capture; the entry holds those references as long as its graphs.

A compiled forward (`RunnerConfig.compile`) is captured without that mode: dynamo runs a frame
eagerly while any dispatch mode is active, and Inductor's kernels read only parameters, the static
inputs and constants the compiled function itself holds.

Side streams forked inside a segment must be joined before it ends (capture_end raises
otherwise; the runner then marks the signature eager).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _KeepAlive(TorchDispatchMode):
    def __init__(self, produced: set[int], keep: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.produced, self.keep = produced, keep

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for t in _flat_tensors(out):
            self.produced.add(t.untyped_storage().data_ptr())
        for t in _flat_tensors(args):
            if t.untyped_storage().data_ptr() not in self.produced:
                self.keep[id(t)] = t
        for t in _flat_tensors(tuple(kwargs.values())):
            if t.untyped_storage().data_ptr() not in self.produced:
                self.keep[id(t)] = t
        return out


def _flat_tensors(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            if isinstance(x, torch.Tensor):
                yield x
            elif isinstance(x, (list, tuple)):
                yield from (y for y in x if isinstance(y, torch.Tensor))


class CudaSegment:
    __slots__ = ("graph",)

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


class CudaRecorder:
    def __init__(self, device: torch.device, watch_inputs: bool = True) -> None:
        self.device = device
        self.watch_inputs = watch_inputs
        self.pool = torch.cuda.graph_pool_handle()
        self.keep: dict[int, torch.Tensor] = {}  # external tensors the graphs read
        self._produced: set[int] = set()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._mode: _KeepAlive | None = None
        torch.cuda.synchronize(device)
        self._reserved0 = torch.cuda.memory_reserved(device)

    def begin(self) -> None:
        assert self._graph is None, "CUDA segment already open"
        if self.watch_inputs:
            self._mode = _KeepAlive(self._produced, self.keep)
            self._mode.__enter__()
        g = torch.cuda.CUDAGraph()
        # thread_local: encoder threads of the job may touch CUDA while we capture.
        g.capture_begin(pool=self.pool, capture_error_mode="thread_local")
        self._graph = g

    def end(self) -> CudaSegment:
        g, self._graph = self._graph, None
        assert g is not None, "no CUDA segment open"
        try:
            g.capture_end()
        finally:
            self._exit_mode()
        g.replay()
        return CudaSegment(g)

    def abort(self) -> None:
        g, self._graph = self._graph, None
        try:
            if g is not None:
                g.capture_end()
        except Exception:  # noqa: BLE001 - an invalidated capture raises here, as expected
            _recover_after_failed_capture(self.device, self.pool)
        finally:
            self._exit_mode()

    def _exit_mode(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def nbytes(self) -> int:
        torch.cuda.synchronize(self.device)
        return max(0, torch.cuda.memory_reserved(self.device) - self._reserved0)


def _recover_after_failed_capture(device: torch.device, pool) -> None:
    """Undo what a failed `capture_end` left behind, so the job can go on eagerly.

    torch's `CUDAGraph.capture_end` raises at `cudaStreamEndCapture` on an invalidated capture,
    before it ends the allocator's routing into the graph pool and before the RNG generator's
    capture epilogue. The generator then refuses every later random op ("Offset increment outside
    graph capture encountered unexpectedly"), the warm-up's `randn` included. We end the pool
    routing ourselves and, if the default generator is stuck, swap in a clone of its state (same
    seed and offset, not capturing). Graphs captured earlier keep the old state object; DiT
    inference graphs draw no random numbers, so nothing reads it.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        fn = getattr(torch._C, name, None)
        if fn is not None:
            try:
                fn(index, pool)
            except Exception:  # noqa: BLE001 - already ended (capture_end got that far)
                pass
    try:
        torch.empty(1, device=device).uniform_()
    except RuntimeError:
        gen = torch.cuda.default_generators[index]
        gen.graphsafe_set_state(gen.clone_state())


class CudaBackend:
    name = "cuda"

    def __init__(self, device: torch.device, watch_inputs: bool = True) -> None:
        self.device = torch.device(device)
        self.watch_inputs = watch_inputs
        self._stream: torch.cuda.Stream | None = None

    @contextlib.contextmanager
    def stream(self) -> Iterator[None]:
        # Warm-up and capture run on a side stream (capture is illegal on the legacy default
        # stream); the fences order it after the caller's work and the caller after it.
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        try:
            with torch.cuda.stream(self._stream):
                yield
        finally:
            current.wait_stream(self._stream)

    def recorder(self) -> CudaRecorder:
        return CudaRecorder(self.device, self.watch_inputs)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def released(self) -> None:
        # Freed pools go back to the driver so eager work (the VAE decode) can use that memory.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
