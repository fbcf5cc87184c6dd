"""A rule's rewritten forward, verified as a whole against the module's own forward.

The verifier checks each fused chain against its transcription of diffusers' ops; this checks the
transcription itself: on first sight of an input key (keys.call_key: shapes, strides, dtypes,
alignment, plain values) the module's own forward and the rewritten one run on the same live
inputs, and their outputs must be equal bit for bit (torch.equal, same strides). Equal: the
rewritten forward serves that key from then on (this call returns its outputs: the same bits).
Different (or raising): the module's own forward serves it, for good, and the rejection is counted
and logged. A key first seen inside a graph capture runs the module's own forward (the runner's
eager warm-ups see keys first).

    fwd = guarded("flux_block", block, fused_forward, fx, variant=lambda *a, **kw: ...)

`variant` names state outside the arguments that steers the rewritten forward down another path
(SANA: a normalised input handed over by the previous block, K/V made by the prompt memo): each
variant is verified on its own. Contract for both forwards: they do not edit their inputs in
place and draw no random numbers (the rules install only on modules in eval mode).
"""

from __future__ import annotations

import itertools
import types
from typing import Any, Callable

from torch import nn

from .applicable import NotApplicable
from .keys import call_key, module_key
from .verify import Verifier, capturing, difference


def guarded(rule: str, module: nn.Module, fused: Callable, fx: Verifier, original: Callable | None = None,
            variant: Callable[..., Any] | None = None) -> Callable:
    """`fused` wrapped to serve `module` only for input keys where it equalled `original` (the
    module's class forward, bound to it, unless given)."""
    if original is None:
        original = types.MethodType(type(module).forward, module)
    counter = fx.shared.setdefault(("ordinal", rule), itertools.count())
    # The module's place among this rule's modules (named_modules order): with its structure, what
    # a verdict kept across runs is about (cache.py); ids do not survive a run.
    where = (rule, next(counter), module_key(module))
    verdicts: dict[Any, bool] = {}
    c = fx.counters

    def forward(*args: Any, **kwargs: Any) -> Any:
        k = call_key(args, kwargs) if variant is None else (call_key(args, kwargs), variant(*args, **kwargs))
        ok = verdicts.get(k)
        if ok is None and fx.cache is not None:
            ok = fx.cache.get(("forward", where, k))
            if ok is not None:
                verdicts[k] = ok
                c.cached += 1
        if ok:
            try:
                return fused(*args, **kwargs)
            except NotApplicable:  # a layout the key did not capture: the module's own, for good
                verdicts[k] = False
                c.not_applicable += 1
                return original(*args, **kwargs)
        if ok is False:
            return original(*args, **kwargs)
        if capturing((args, kwargs)):
            c.forwards_unverified_in_capture += 1
            return original(*args, **kwargs)
        want = original(*args, **kwargs)
        got, compared = None, True
        try:
            got = fused(*args, **kwargs)
            why = difference(got, want)
        except Exception as exc:  # noqa: BLE001 - a forward that cannot run this key is a rejection
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            compared = False  # for this run only: an error (out of memory) may not recur
        fx.judge(f"{rule} forward of {type(module).__name__}", ("forward",) + tuple(k), why, forward=True)
        verdicts[k] = why is None
        if compared:
            fx.remember(("forward", where, k), why is None, f"{rule}: {why or 'equal'}")
        # Equal: the rewritten forward's own tensors (the same bits), so that state it left keyed on
        # them (a norm handed to the next block) serves the next module in this very forward, and
        # its path is verified now rather than first seen inside a capture.
        return got if why is None else want

    forward.__bcg_fusion__ = rule  # type: ignore[attr-defined]
    forward.__wrapped__ = fused  # type: ignore[attr-defined]
    return forward
