"""Find the ops where a row's bytes start to depend on its batch.

Run the same function twice: on inputs of batch b (the reference) and on inputs whose first b
rows are those same rows, followed by others (batch N). Every aten op is recorded in the first
run and compared in the second, on the rows both runs share. An op whose shared input rows are
bitwise equal in both runs but whose shared output rows are not is an *origin*: it computed the
same row differently because of the rest of the batch. Every other differing op only carries a
difference it was handed.

    report = compare_rows(lambda kw: model(**kw), inputs_b1, inputs_b8)
    report.origins          # [Origin(op="aten.addmm.default", shapes=..., max_abs=...), ...]
    report.first_difference # index and name of the first op whose output rows differ

The rows a tensor shares with the reference are found from shapes alone: the dimension that grew
by a whole factor (batch-first layouts, [B*S, C] and [B*H, S, D] alike) is cut back to the
reference's size. Tensors whose shapes do not relate that way are left uncompared (counted).
Mechanism only: it knows nothing of models, and costs a clone of every op's tensors (tiny models).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

# identities of value that run only for some shapes (`contiguous` is dispatched only when the
# tensor is not: a batch of 1 often is), so they would misalign the two op sequences
# (and the allocations, whose bytes are whatever memory held)
_SKIP = {"aten.detach.default", "aten.alias.default", "aten.lift_fresh.default", "aten.contiguous.default",
         "aten.empty_like.default", "aten.empty.memory_format", "aten.new_empty.default",
         "aten.empty_strided.default", "aten.new_empty_strided.default"}


def _tensors(obj) -> List[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def shared_rows(big: torch.Tensor, ref: torch.Tensor) -> Optional[torch.Tensor]:
    """The part of `big` that corresponds to all of `ref` (its leading rows), or None."""
    if big.shape == ref.shape:
        return big
    if big.dim() != ref.dim():
        return None
    grown = [d for d in range(big.dim()) if big.shape[d] != ref.shape[d]]
    if len(grown) != 1:
        return None
    d = grown[0]
    if ref.shape[d] == 0 or big.shape[d] % ref.shape[d]:
        return None
    return big.narrow(d, 0, ref.shape[d])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():  # NaN == NaN here: equal bytes, not equal values
        return torch.equal(torch.nan_to_num(a, 0.0, 1.0, -1.0), torch.nan_to_num(b, 0.0, 1.0, -1.0)) and \
            torch.equal(a.isnan(), b.isnan())
    return torch.equal(a, b)


@dataclass
class Origin:
    index: int  # position in the op sequence
    op: str
    shapes: list  # the reference run's input shapes
    big_shapes: list  # the batch-N run's input shapes
    max_abs: float
    isolated: bool  # found by re-running the op on shared rows put back (its inputs had differed)


@dataclass
class RowReport:
    ops: int = 0
    compared: int = 0
    uncompared: int = 0
    origins: List[Origin] = field(default_factory=list)
    first_difference: Optional[tuple] = None  # (index, op)
    sequence_break: Optional[str] = None  # the op sequences stopped matching here
    outputs_equal: Optional[bool] = None

    def origin_ops(self) -> dict:
        """{op name: how many times it was an origin}"""
        out: dict = {}
        for o in self.origins:
            out[o.op] = out.get(o.op, 0) + 1
        return out


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        pre = _inputs_before(func, args, kwargs)
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if name not in _SKIP:
            self.ops.append((name, pre if pre is not None else [t.detach().clone() for t in _tensors((args, kwargs))],
                             [t.detach().clone() for t in _tensors(out)]))
        return out


class _Comparer(TorchDispatchMode):
    def __init__(self, ref_ops: list, report: RowReport, max_origins: int, isolate: bool) -> None:
        super().__init__()
        self.ref, self.report, self.i, self.max_origins, self.isolate = ref_ops, report, 0, max_origins, isolate

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rep = self.report
        pre = _inputs_before(func, args, kwargs) if rep.sequence_break is None else None
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if name in _SKIP or rep.sequence_break is not None:
            return out
        i, self.i = self.i, self.i + 1
        rep.ops += 1
        if i >= len(self.ref) or self.ref[i][0] != name:
            rep.sequence_break = f"op {i}: {name} where the reference ran " \
                                 f"{self.ref[i][0] if i < len(self.ref) else 'nothing'}"
            return out
        _, ref_in, ref_out = self.ref[i]
        live = _tensors((args, kwargs))
        big_in, big_out = (pre if pre is not None else live), _tensors(out)
        shared = [shared_rows(b, r) for r, b in zip(ref_in, big_in)]
        ins_equal = len(ref_in) == len(big_in) and all(
            s is not None and bitwise_equal(s, r) for s, r in zip(shared, ref_in))
        diff = self._first_diff(ref_out, big_out, count=True)
        if diff is not None and rep.first_difference is None:
            rep.first_difference = (i, name)
        isolated = False
        if not ins_equal and self.isolate and len(ref_in) == len(big_in) and all(s is not None for s in shared):
            # The op handed other rows: run it again on its own inputs with the shared rows put
            # back to the reference's, so it is judged on what it computes, not on what it was given.
            patched = {id(t): _patch(b, r) for r, b, t in zip(ref_in, big_in, live)}
            a2, k2 = tree_map(lambda t: patched.get(id(t), t) if isinstance(t, torch.Tensor) else t, (args, kwargs))
            diff = self._first_diff(ref_out, _tensors(func(*a2, **(k2 or {}))), count=False)
            isolated = ins_equal = True
        if ins_equal and diff is not None and len(rep.origins) < self.max_origins:
            rep.origins.append(Origin(i, name, [list(t.shape) for t in ref_in], [list(t.shape) for t in big_in],
                                      diff, isolated))
        return out

    def _first_diff(self, ref_out, big_out, count: bool) -> Optional[float]:
        """max |difference| over the first output whose shared rows differ, or None."""
        for r, b in zip(ref_out, big_out):
            s = shared_rows(b, r)
            if s is None:
                self.report.uncompared += count
                continue
            self.report.compared += count
            if not bitwise_equal(s, r):
                diff = (s - r) if s.is_complex() else (s.double() - r.double())  # complex: rotary tables
                return float(diff.abs().double().nan_to_num(float("inf")).max())
        return None


def _inputs_before(func, args, kwargs) -> Optional[List[torch.Tensor]]:
    """An in-place op's (or an out= op's) tensors as they were before it ran, else None (read after).
    Read after it ran, an in-place op's `self` already holds its result: LTX-2's split RoPE
    (`addcmul_` into a slice) looked like an origin wherever a difference reached it from upstream."""
    if not func._schema.is_mutable:
        return None
    return [t.detach().clone() for t in _tensors((args, kwargs))]


def _patch(big: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    out = big.clone()
    rows = shared_rows(out, ref)
    assert rows is not None  # the recorder patches only when every input's shared rows exist
    rows.copy_(ref)
    return out


def compare_rows(fn: Callable[[Any], Any], ref_inputs: Any, big_inputs: Any, max_origins: int = 200,
                 isolate: bool = True) -> RowReport:
    """Run `fn(ref_inputs)` and `fn(big_inputs)` op by op (see the module docstring). `isolate`:
    also judge ops whose inputs already differed, by re-running them on the reference's rows."""
    rec = _Recorder()
    with torch.inference_mode(), rec:
        ref_out = fn(ref_inputs)
    report = RowReport()
    with torch.inference_mode(), _Comparer(rec.ops, report, max_origins, isolate):
        big_out = fn(big_inputs)
    pairs = list(zip(_tensors(ref_out), _tensors(big_out)))
    report.outputs_equal = bool(pairs) and all(
        (s := shared_rows(b, r)) is not None and bitwise_equal(s, r) for r, b in pairs)
    return report
