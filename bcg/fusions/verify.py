"""The verifier: a fused chain runs only where it has equalled eager, bit for bit, on live inputs.

    first sight of (op, key)   outside capture: run eager and fused, compare (torch.equal, same
                               strides); equal -> fused for good, else eager for good; log once,
                               count; this call returns eager's result
                               under capture: eager (never verify inside a graph; the runner's
                               warm-up forwards, run eagerly before each capture, see keys first)
    verified                   fused (a NotApplicable raised there after all: eager for good)
    rejected / not applicable  eager (or the op's fallback chain)

The key is what can change the kernel's bits (keys.py): shapes, strides, dtypes, device and pointer
alignment of every tensor argument, the parameter keys of module arguments, and plain values.
Verdicts persist across runs in the user's cache (cache.py) when the backend is Triton.

Whole forwards (a block, a processor, a caption path) are verified the same way, against the
module's own forward, by guard.py; both count here.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable

import torch

from ..graph import active_capture
from ..tree import tensor_leaves
from .applicable import NotApplicable
from .cache import VerdictCache
from .keys import module_key, tensor_key, value_key
from .ops import Op

log = logging.getLogger(__name__)

BACKENDS = ("triton", "reference")
_DEFAULT = object()


@dataclass
class FusionCounters:
    verified: int = 0
    """(op, key) pairs whose fused result equalled eager's: they run fused from then on."""
    rejected: int = 0
    """(op, key) pairs that differed from eager (or raised): they run eager for good."""
    fused_calls: int = 0
    eager_calls: int = 0
    """Calls that ran eager: rejected keys, and keys first seen inside a graph capture."""
    handed_on: int = 0
    """Calls a chain's candidate passed to the next candidate (its key rejected, not applicable or first seen
    in a capture): no eager run, the next candidate decides. RMSNorm's variance under the invariant mode
    hands each call past its four aten-order candidates, which session 46's summaries counted as eager calls."""
    unverified_in_capture: int = 0
    not_applicable: int = 0
    """(op, key) pairs the fused plan does not cover (a layout, a module config): eager, no failure."""
    forwards_verified: int = 0
    """(rule, module, input key) triples whose rewritten forward equalled the module's own."""
    forwards_rejected: int = 0
    """... that differed (or raised): that module runs its own forward for that key."""
    forwards_unverified_in_capture: int = 0
    cached: int = 0
    """Verdicts (op or forward) taken from the cache of earlier runs instead of a comparison."""
    rejections: list = field(default_factory=list)
    """One line per rejected (op, key) or forward: what differed."""

    def as_dict(self) -> dict:
        return asdict(self)


class Verifier:
    def __init__(self, backend: str = "triton", cache: Any = _DEFAULT) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"fusion backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.counters = FusionCounters()
        self.state: dict[tuple, bool] = {}
        self._module_keys: dict[int, tuple] = {}
        # per-installation state of rules (sana: the mask cache); guard keys its ordinals ("ordinal", rule)
        self.shared: dict[Hashable, Any] = {}
        # The GPU's verdicts persist; the reference backend (CPU tests) verifies every run unless
        # a test hands it a cache.
        self.cache: VerdictCache | None = (VerdictCache.default() if backend == "triton" else None) \
            if cache is _DEFAULT else cache

    def key(self, op: Op, args: tuple) -> tuple:
        parts: list[Any] = [op.name]
        for a in args:
            if isinstance(a, torch.Tensor):
                parts.append(tensor_key(a))
            elif isinstance(a, torch.nn.Module):
                k = self._module_keys.get(id(a))
                if k is None:
                    k = self._module_keys[id(a)] = module_key(a)
                parts.append(k)
            elif isinstance(a, (tuple, list, dict)):
                parts.append(value_key(a))
            else:
                parts.append(a)
        return tuple(parts)

    def impl(self, op: Op) -> Callable:
        return op.fused if self.backend == "triton" else op.reference

    def call(self, op: Op, *args: Any, fallback: Callable | None = None) -> Any:
        """`op` on `args`: fused where verified, else eager (`fallback`, when given, stands in for
        eager: a cheaper verified chain of the same result)."""
        k = self.key(op, args)
        ok = self.state.get(k)
        if ok is None and self.cache is not None:
            ok = self._cached(("op", k))
            if ok is not None:
                self.state[k] = ok
        slow = fallback or op.eager
        if ok:
            try:
                out = self.impl(op)(*args)
            except NotApplicable as exc:  # the key missed what decides applicability: eager for good
                self._not_applicable(op.name, k, exc)
                return slow(*args)
            self.counters.fused_calls += 1
            return out
        if ok is False:
            self._count_slow(fallback)
            return slow(*args)
        if capturing(args):
            self.counters.unverified_in_capture += 1
            self._count_slow(fallback)
            return slow(*args)
        out = self._verify(op, k, args)
        if fallback is not None and not self.state[k]:
            # verify the fallback chain now, outside capture, rather than on a later call that
            # may be the capture itself (same bits either way)
            return fallback(*args)
        return out

    def _count_slow(self, fallback: Callable | None) -> None:
        if isinstance(fallback, _Link):
            self.counters.handed_on += 1
        else:
            self.counters.eager_calls += 1

    def _cached(self, key: tuple) -> bool | None:
        assert self.cache is not None  # the caller asks only when there is a cache
        ok = self.cache.get(key)
        if ok is not None:
            self.counters.cached += 1
        return ok

    def _not_applicable(self, name: str, k: tuple, exc: Exception) -> None:
        self.state[k] = False
        self.counters.not_applicable += 1
        log.info("bcg.fusions: %s does not apply to %s (%s); eager", name, describe(k), exc)

    def _verify(self, op: Op, k: tuple, args: tuple) -> Any:
        want = op.eager(*args)
        try:
            got = self.impl(op)(*args)
            why = difference(got, want)
        except NotApplicable as exc:
            self._not_applicable(op.name, k, exc)
            self.remember(("op", k), False, f"{op.name}: not applicable ({exc})")
            return want
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot run this key is a rejection
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self.judge(op.name, k, why)  # for this run only: an error (out of memory) may not recur
            return want
        self.judge(op.name, k, why)
        self.remember(("op", k), why is None, f"{op.name} {describe(k)}: {why or 'equal'}")
        return want

    def judge(self, name: str, k: tuple, why: str | None, forward: bool = False) -> None:
        """Record a first-sight verdict: `why` None means equal to eager."""
        self.state[k] = why is None
        desc = describe(k)
        if why is None:
            if forward:
                self.counters.forwards_verified += 1
            else:
                self.counters.verified += 1
            log.info("bcg.fusions: %s verified bit-exact for %s", name, desc)
            return
        if forward:
            self.counters.forwards_rejected += 1
        else:
            self.counters.rejected += 1
        self.counters.rejections.append(f"{name} {desc}: {why}")
        log.warning("bcg.fusions: %s differs from eager for %s (%s); it runs eager for this key", name, desc, why)

    def remember(self, key: tuple, ok: bool, what: str) -> None:
        if self.cache is not None:
            self.cache.put(key, ok, what)


class _Link:
    """One candidate of a chain: `call(op, *args, fallback=nxt)`. A call it passes on is counted as
    handed on, not as an eager run (Verifier._count_slow)."""

    def __init__(self, call: Callable, op: Op, nxt: Callable | None) -> None:
        self.call, self.op, self.nxt = call, op, nxt

    def __call__(self, *args: Any) -> Any:
        return self.call(self.op, *args, fallback=self.nxt)


def chain(call: Callable, ops: tuple, last: Callable | None = None) -> Callable:
    """call(ops[0], ...), falling back to ops[1], ... and finally `last` (default: the last op's
    eager): the first variant the verifier found equal to eager runs (candidate orders,
    contractions, norms run by aten)."""
    fb: Callable | None = last
    for op in reversed(ops):
        fb = _Link(call, op, fb)
    assert fb is not None, "chain needs at least one op"
    return fb


def capturing(args: Any) -> bool:
    """True inside a bcg capture or a CUDA stream capture (judged by the first tensor argument)."""
    if active_capture() is not None:
        return True
    for a in tensor_leaves(args):
        return a.is_cuda and torch.cuda.is_current_stream_capturing()
    return False


def difference(got: Any, want: Any) -> str | None:
    """None if `got` equals `want` bit for bit (tensors: values, shape, dtype, strides), else what differs."""
    if isinstance(want, (tuple, list)):  # several outputs: each must equal eager's
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"output {type(got).__name__} vs eager's {type(want).__name__} of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = difference(g, w)
            if why is not None:
                return f"output {i}: {why}"
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or list(got) != list(want):
            return f"output keys {list(got) if isinstance(got, dict) else type(got).__name__} vs {list(want)}"
        for name in want:
            why = difference(got[name], want[name])
            if why is not None:
                return f"output {name}: {why}"
        return None
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"output {got!r} vs eager {want!r}"
    if not isinstance(got, torch.Tensor):
        return f"output types {type(got).__name__} vs {type(want).__name__}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"output {tuple(got.shape)} {got.dtype} vs eager {tuple(want.shape)} {want.dtype}"
    if got.stride() != want.stride():
        # the next op (a GEMM, a conv) may take another path on another layout
        return f"output strides {got.stride()} vs eager {want.stride()}"
    if not torch.equal(got, want):
        if got.is_complex():
            got, want = torch.view_as_real(got), torch.view_as_real(want)
        diff = (got.float() - want.float()).abs()
        return (f"{int((got != want).sum())} of {want.numel()} elements differ, max abs diff "
                f"{float(diff.nan_to_num(0).max()):.3g}")
    return None


def describe(k: Any) -> str:
    """The shapes and dtypes of a key's tensors, for log lines."""
    found: list[str] = []

    def walk(p: Any) -> None:
        if isinstance(p, tuple) and len(p) == 6 and p[0] == "T":
            found.append(f"{list(p[1])}:{p[3]}" + ("" if p[5] == 16 else f"@{p[5]}B"))
        elif isinstance(p, tuple):
            for x in p:
                walk(x)

    walk(k[1:] if isinstance(k, tuple) else k)
    return "[" + ", ".join(found) + "]"
