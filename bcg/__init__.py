"""bcg: breakable CUDA graphs for diffusion transformers (model-agnostic).

A module's forward is captured, per call signature, as CUDA graph segments that share one memory
pool, with eager *breaks* between them (attention kernels, or anything marked `eager_on_graph`),
and replayed on later calls with the same signature.

    runner = apply_graph_runner(pipe.transformer, RunnerConfig(break_policy="attention"))
    runner.capture_allowed = True       # the job toggles this per planned signature run
    images = pipe(...)                  # every denoising step: replay (or capture / miss)
    runner.release_all()                # a sorted run of one signature ended
    runner.stats()                      # counters for summary.json

Static-buffer rule: a graph reads and writes fixed addresses. Static inputs, bridges (break
outputs the next segment reads) and outputs are allocated once at capture and only written in
place (copy_ of live inputs, copy_ of fresh break results, the replay itself); they are never
reassigned, resized or handed to callers (callers get clones). `RunnerConfig.debug_check_buffers`
checks their addresses on every replay.

Files: signature (keys), graph (segments, breaks, capture state), breaks (decorator,
installation), memo (breaks re-run only when their inputs changed), backend (protocol),
cuda_backend (CUDA graphs), tape (CPU op tape for tests),
entry (one captured signature), runner (hit / capture / miss), counters, config; fusions/ (the
"lossless" tier's bit-exact fused Triton kernels, verified against eager on first sight; installed
by `apply_graph_runner` on the CUDA backend; `RunnerConfig.fusions`).
"""

from .breaks import count_breaks, eager_on_graph, install_breaks, remove_breaks
from .config import RunnerConfig
from .counters import Counters
from .memo import memo_on_graph
from .runner import GraphRunner, apply_graph_runner
from .signature import describe_difference, flatten, signature

__all__ = [
    "Counters",
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
    "signature",
]
