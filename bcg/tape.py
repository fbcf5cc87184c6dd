"""The CPU op tape: a real (not mocked) segment backend, so CI can test the engine without a GPU.

While a segment is open, a `TorchDispatchMode` runs every aten op and records it with its
arguments and outputs. Replay re-runs the recorded ops on the recorded tensors and copies each
fresh result into the recorded output, so recorded tensors behave like a CUDA graph's static
memory: a new value copied into a static input changes the replayed result, a stale bridge
changes it too, and a tensor re-created outside the tape is never seen.

    view ops (alias outputs)       not re-run: the recorded view still aliases its base (a may-alias
                                   op whose output is new memory, as reshape can be, is functional)
    in-place and out= ops          re-run: they write into the recorded tensors themselves
    functional ops                 re-run, result copied into the recorded output

Limits (it exists for tests, CUDA graphs are the product path): ops that read tensor data on the
host (`.item()`, `nonzero`, `equal`, ...) raise during a tape capture, as they would break a CUDA
capture; random ops draw fresh numbers on replay; every recorded output stays alive (no pool
reuse), and replay runs op by op through Python, slower than eager.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_HOST_READS = frozenset(
    {
        "aten._local_scalar_dense", "aten.is_nonzero", "aten.equal", "aten.allclose",
        "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique", "aten._unique2",
        "aten.unique_consecutive", "aten.unique_dim",
    }
)


class HostReadDuringCapture(RuntimeError):
    """An op read tensor data on the host inside a segment: no graph can capture that."""


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [x for x in obj if isinstance(x, torch.Tensor)]
    return []


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.shape == b.shape


class _Op:
    __slots__ = ("func", "args", "kwargs", "outputs", "copy_out")

    def __init__(self, func, args, kwargs, outputs, copy_out):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.outputs, self.copy_out = outputs, copy_out

    def run(self) -> None:
        fresh = self.func(*self.args, **self.kwargs)
        if self.copy_out:
            for dst, src in zip(self.outputs, _tensors(fresh)):
                if not _same_memory(dst, src):
                    dst.copy_(src)


def _aliases_an_input(out: Any, args: tuple, kwargs: dict) -> bool:
    inputs = {t.untyped_storage().data_ptr() for t in _tensors(list(args) + list(kwargs.values()))}
    return any(t.untyped_storage().data_ptr() in inputs for t in _tensors(out))


def _kind(func) -> str:
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "mutating"
    if any(r.alias_info is not None for r in schema.returns):
        return "view"
    return "functional"


class _TapeMode(TorchDispatchMode):
    def __init__(self, ops: list[_Op]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if name in _HOST_READS:
            raise HostReadDuringCapture(
                f"{name} reads tensor data on the host inside a graph segment; CUDA graphs cannot "
                "capture it: mark the function that calls it with @eager_on_graph or keep it out "
                "of the captured forward"
            )
        out = func(*args, **kwargs)
        kind = _kind(func)
        if kind == "view" and not _aliases_an_input(out, args, kwargs):
            # A may-alias op that made a new tensor: reshape of a layout no view can express,
            # .to() a new dtype, contiguous(). No-grad dispatch decomposes these into a clone or
            # _to_copy; inference_mode hands the composite op here whole. Re-run it like any other.
            kind = "functional"
        if kind != "view":
            self.ops.append(_Op(func, args, kwargs, _tensors(out), kind == "functional"))
        return out


class TapeSegment:
    def __init__(self, ops: list[_Op]) -> None:
        self.ops = ops

    def replay(self) -> None:
        for op in self.ops:
            op.run()


class TapeRecorder:
    def __init__(self) -> None:
        self._mode: _TapeMode | None = None
        self._segments: list[TapeSegment] = []

    def begin(self) -> None:
        assert self._mode is None, "tape segment already open"
        self._mode = _TapeMode([])
        self._mode.__enter__()

    def end(self) -> TapeSegment:
        mode, self._mode = self._mode, None
        assert mode is not None, "no tape segment open"
        mode.__exit__(None, None, None)
        seg = TapeSegment(mode.ops)
        self._segments.append(seg)
        return seg

    def abort(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        for seg in self._segments:
            for op in seg.ops:
                if op.copy_out:
                    for t in op.outputs:
                        st = t.untyped_storage()
                        seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())


class TapeBackend:
    name = "tape"

    def stream(self) -> ContextManager:
        return contextlib.nullcontext()

    def recorder(self) -> TapeRecorder:
        return TapeRecorder()

    def synchronize(self) -> None:
        pass

    def released(self) -> None:
        pass
