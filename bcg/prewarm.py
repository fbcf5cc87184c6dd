"""Costs a process pays once, on first use, started ahead on a thread while it does other work.

Triton's cache key. The first launch of any Triton kernel in a process looks its binary up in
Triton's on-disk cache under a key that starts with `triton_key()`: a sha256 over Triton's compiler
and language sources and its `libtriton` library (500 MB in Triton 3.9), computed once and
kept by `functools.lru_cache`. py-spy put 0.38 s of a SANA-1.6B job's first batch on an H100 host in
it (0.6 s on a 2-core CPU), paid by the first batch's decode warm-up on the main thread and by the
text encoder's first call on the prefetch thread at once (lru_cache holds no lock, so both computed
it): `benchmarks/results/job_wall_spy_1024_s57.md`. The work is file reads and hashing of megabyte
blocks, both of which release the GIL, so it runs beside the model's imports, which are Python: on one
warm H100 those read 0.25 s longer (the thread takes the GIL back between blocks, and Triton's own
import moved into them) and the first batch came 0.26 s sooner, with the checksum change of the same
commit (`job_wall_h100_1024_64_prewarm_s57.md`).

The cached value is the one Triton computes itself (its own function, called here first), so the
kernels found in the cache, and the bytes they give, are the same.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any, Optional, Protocol, cast

log = logging.getLogger(__name__)


class _Cached(Protocol):
    """A function wrapped by functools.lru_cache."""

    def __call__(self) -> str: ...

    def cache_info(self) -> Any: ...


def _triton_key_function() -> Optional[_Cached]:
    """Triton's lru-cached `triton_key`, wherever this Triton keeps it; None without Triton, or where
    it is not cached (computing it here would then be wasted)."""
    for module in ("triton.runtime.cache", "triton.compiler.compiler"):  # where newer and older Tritons keep it
        try:
            fn = getattr(importlib.import_module(module), "triton_key", None)
        except ImportError:
            continue
        except Exception:  # noqa: BLE001 - a Triton that fails to import: nothing to warm
            return None
        if fn is not None:
            return cast(_Cached, fn) if hasattr(fn, "cache_info") else None
    return None


def _compute(fn: _Cached) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the first real launch computes it again and reports its own error
        log.debug("Triton's cache key was not computed ahead: %s", e)


def start_triton_key() -> Optional[threading.Thread]:
    """Compute Triton's cache key on a daemon thread; returns the thread, or None where there is nothing
    to compute (no Triton, or the key is known already). Triton is imported here, on the caller's
    thread (0.1 s, and the model's imports import it anyway): only the hashing runs beside the caller,
    and no import runs on two threads at once."""
    fn = _triton_key_function()
    if fn is None or fn.cache_info().currsize:
        return None
    thread = threading.Thread(target=_compute, args=(fn,), name="bcg-triton-key", daemon=True)
    thread.start()
    return thread
