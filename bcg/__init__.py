"""bcg: breakable CUDA graphs for diffusion transformers (model-agnostic).

A module's forward is captured, per call signature, as CUDA graph segments that share one memory
pool, with eager *breaks* between them (attention kernels, or anything marked `eager_on_graph`),
and replayed on later calls with the same signature.

    runner = apply_graph_runner(pipe.transformer, RunnerConfig(), break_policy="attention")
    with runner.call_scope(Dispatch.CAPTURE):   # the caller's decision for this pipeline call
        images = pipe(...)              # every denoising step: replay (or capture / miss)
    runner.release_all()                # a sorted run of one signature ended
    runner.stats()                      # counters for summary.json

Static-buffer rule: a graph reads and writes fixed addresses. Static inputs, bridges (break
outputs the next segment reads) and outputs are allocated once at capture and only written in
place (copy_ of live inputs, copy_ of fresh break results, the replay itself); they are never
reassigned, resized or handed to callers (callers get clones). `RunnerConfig.debug_check_buffers`
checks their addresses on every replay.

Files: signature (keys), graph (segments, breaks, capture state), hooks (the one way a forward
is wrapped: ordered, named, removable), breaks (decorator, installation), memo (breaks re-run only
when their inputs changed), backend (protocol), cuda_backend (CUDA graphs), tape (CPU op tape for
tests), entry (one captured signature), runner (dispatch / hit / capture / miss), rewrites (the
seam where a tier's forward rewrites plug in), counters, config, compiled, prewarm (once-a-process
costs started ahead on a thread: Triton's cache key).

fusions/ is the "lossless" tier: bit-exact fused Triton kernels, verified against eager on first
sight, registered as that tier's rewrite (bcg/rewrites.py) and installed by `apply_graph_runner` on
the CUDA backend. The core never imports it: `rewrites.rewrite_for("lossless")` imports it by name
the first time the tier is asked for.

This face is lazy (PEP 562): `import bcg.config` (the planner and the config check read
`RunnerConfig`) costs no torch or Triton import; the names below load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module of this package that defines it. No name may also be a submodule's name:
# importing that submodule sets the package attribute to the module, which then shadows the
# lazy name (so `signature` the function is `bcg.signature.signature`, not on this face).
_EXPORTS = {
    "Counters": "counters",
    "Dispatch": "runner",
    "GraphRunner": "runner",
    "RunnerConfig": "config",
    "apply_graph_runner": "runner",
    "count_breaks": "breaks",
    "describe_difference": "signature",
    "eager_on_graph": "breaks",
    "flatten": "signature",
    "install_breaks": "breaks",
    "memo_on_graph": "breaks",
    "remove_breaks": "breaks",
}

__all__ = [
    "Counters",
    "Dispatch",
    "GraphRunner",
    "RunnerConfig",
    "apply_graph_runner",
    "count_breaks",
    "describe_difference",
    "eager_on_graph",
    "flatten",
    "install_breaks",
    "memo_on_graph",
    "remove_breaks",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from .breaks import count_breaks, eager_on_graph, install_breaks, memo_on_graph, remove_breaks
    from .config import RunnerConfig
    from .counters import Counters
    from .runner import Dispatch, GraphRunner, apply_graph_runner
    from .signature import describe_difference, flatten


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bcg' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
