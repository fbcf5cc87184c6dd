"""The verifier: a fused chain runs only where it has equalled eager, bit for bit, on live inputs.

    first sight of (op, key)   outside capture: run eager and fused, compare (torch.equal, same
                               strides); equal -> fused for good, else eager for good; log once,
                               count; this call returns eager's result
                               under capture: eager (never verify inside a graph; the runner's
                               warm-up forwards, run eagerly before each capture, see keys first)
    verified                   fused
    rejected / not applicable  eager (or the op's fallback chain)

The key is what can change the kernel's bits: shapes, strides, dtypes, device of every tensor
argument, the parameter shapes of module arguments, and plain values.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..graph import active_capture
from .applicable import NotApplicable
from .ops import Op

log = logging.getLogger(__name__)

BACKENDS = ("triton", "reference")


@dataclass
class FusionCounters:
    verified: int = 0
    """(op, key) pairs whose fused result equalled eager's: they run fused from then on."""
    rejected: int = 0
    """(op, key) pairs that differed from eager (or raised): they run eager for good."""
    fused_calls: int = 0
    eager_calls: int = 0
    """Calls that ran eager: rejected keys, and keys first seen inside a graph capture."""
    unverified_in_capture: int = 0
    not_applicable: int = 0
    """(op, key) pairs the fused plan does not cover (a layout, a module config): eager, no failure."""
    rejections: list = field(default_factory=list)
    """One line per rejected (op, key): what differed."""

    def as_dict(self) -> dict:
        return asdict(self)


def _tensor_key(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


class Verifier:
    def __init__(self, backend: str = "triton") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"fusion backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.counters = FusionCounters()
        self.state: dict[tuple, bool] = {}
        self._module_keys: dict[int, tuple] = {}
        self.shared: dict[str, Any] = {}  # per-installation state of rules (sana: the mask cache)

    def key(self, op: Op, args: tuple) -> tuple:
        parts: list[Any] = [op.name]
        for a in args:
            if isinstance(a, torch.Tensor):
                parts.append(_tensor_key(a))
            elif isinstance(a, nn.Module):
                k = self._module_keys.get(id(a))
                if k is None:
                    # eps: a norm's only non-tensor setting that changes its bits
                    k = (type(a).__name__, getattr(a, "eps", None)) + tuple(
                        _tensor_key(p) for p in a.parameters(recurse=False))
                    self._module_keys[id(a)] = k
                parts.append(k)
            else:
                parts.append(a)
        return tuple(parts)

    def _impl(self, op: Op) -> Callable:
        return op.fused if self.backend == "triton" else op.reference

    def call(self, op: Op, *args: Any, fallback: Callable | None = None) -> Any:
        """`op` on `args`: fused where verified, else eager (`fallback`, when given, stands in for
        eager: a cheaper verified chain of the same result)."""
        k = self.key(op, args)
        ok = self.state.get(k)
        if ok:
            self.counters.fused_calls += 1
            return self._impl(op)(*args)
        slow = fallback or op.eager
        if ok is False:
            self.counters.eager_calls += 1
            return slow(*args)
        if _capturing(args):
            self.counters.unverified_in_capture += 1
            self.counters.eager_calls += 1
            return slow(*args)
        out = self._verify(op, k, args)
        if fallback is not None and not self.state[k]:
            # verify the fallback chain now, outside capture, rather than on a later call that
            # may be the capture itself (same bits either way)
            return fallback(*args)
        return out

    def _verify(self, op: Op, k: tuple, args: tuple) -> Any:
        want = op.eager(*args)
        try:
            got = self._impl(op)(*args)
            why = _difference(got, want)
        except NotApplicable as exc:
            self.state[k] = False
            self.counters.not_applicable += 1
            log.info("bcg.fusions: %s does not apply to %s (%s); eager", op.name, _describe(k), exc)
            return want
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot run this key is a rejection
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        self.state[k] = why is None
        desc = _describe(k)
        if why is None:
            self.counters.verified += 1
            log.info("bcg.fusions: %s verified bit-exact for %s", op.name, desc)
        else:
            self.counters.rejected += 1
            self.counters.rejections.append(f"{op.name} {desc}: {why}")
            log.warning("bcg.fusions: %s differs from eager for %s (%s); it runs eager for this key",
                        op.name, desc, why)
        return want


def _capturing(args: tuple) -> bool:
    if active_capture() is not None:
        return True
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.is_cuda and torch.cuda.is_current_stream_capturing()
    return False


def _difference(got: Any, want: Any) -> str | None:
    if isinstance(want, tuple):  # a chain with several outputs: each must equal eager's
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"output {type(got).__name__} vs eager's tuple of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = _difference(g, w)
            if why is not None:
                return f"output {i}: {why}"
        return None
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return f"output types {type(got).__name__} vs {type(want).__name__}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"output {tuple(got.shape)} {got.dtype} vs eager {tuple(want.shape)} {want.dtype}"
    if got.stride() != want.stride():
        # the next op (a GEMM, a conv) may take another path on another layout
        return f"output strides {got.stride()} vs eager {want.stride()}"
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs()
        return (f"{int((got != want).sum())} of {want.numel()} elements differ, max abs diff "
                f"{float(diff.nan_to_num(0).max()):.3g}")
    return None


def _describe(k: tuple) -> str:
    shapes = [f"{list(p[0])}{str(p[2]).replace('torch.', ':')}" for p in k[1:]
              if isinstance(p, tuple) and len(p) == 4 and isinstance(p[2], torch.dtype)]
    return "[" + ", ".join(shapes) + "]"
