"""`RunnerConfig`: every knob of the graph runner, one typed dataclass, with the allowed values.

It is the one definition: the job's `bcg` config group (jobs/config.py `BcgConfig`) subclasses it
and adds only what the job decides around the runner (batch sizes, capture policy, batch growth),
so a runner knob has one name, one default and one check. Where a model must break (its break
policy) belongs to the model, not to the runner's knobs: it is an argument of `apply_graph_runner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

BACKENDS = ("auto", "cuda", "tape", "eager")
WARMUPS = ("random", "live")
TIERS = ("lossless", "fast", "off")
POLICIES = ("none", "attention")

BreakPolicy = Union[str, list]


@dataclass
class RunnerConfig:
    enabled: bool = True
    """False: the runner passes every call straight to the module (mode "disabled")."""

    backend: str = "auto"
    """"auto": CUDA graphs when the module's parameters live on a CUDA device, else eager with one
    log line. "cuda": CUDA graphs, error without CUDA. "tape": the CPU op tape (tests and CI only; it
    replays aten ops one by one and is slower than eager). "eager": never capture."""

    warmup_iters: int = 2
    """Eager forwards of a signature before its capture: they let cuBLAS/cuDNN/Triton allocate their
    workspaces, pick algorithms and check fused kernels on first sight outside the graph."""

    warmup: str = "random"
    """What the `warmup_iters` eager forwards compute. "random": extra forwards on random inputs inside
    the capture, so a signature's first call already returns its graph's result. "live": the
    signature's first `warmup_iters` calls themselves run eager (on the side stream a capture uses)
    and return their results, and the next call captures with no extra forward: nothing is computed
    twice. Eager and replay give the same bytes, so only the time differs: a capture then costs the
    capture alone (at SANA-1.6B size, 1024², batch 8, a forward takes about 0.1 s and a capture with
    its two random forwards 0.4-0.45 s). A call scope of `warmup_iters` calls or fewer never captures."""

    max_graphs: int = 32
    """Most captured signatures alive at once; the least recently used is evicted beyond it."""

    max_graph_memory_gb: float = 0.0
    """Most memory all live graphs may hold (GiB, pools plus bridges); 0 means no bound. A capture
    that pushes the total over it evicts older entries; one that exceeds it alone runs eager."""

    debug_check_buffers: bool = False
    """Check on every replay that static inputs, bridges and outputs still sit at the addresses the
    graph captured (see the static-buffer rule in `bcg/__init__.py`). Costs a few µs a replay."""

    fusions: str = "lossless"
    """Quality tier. "lossless": bit-exact fused Triton kernels for the elementwise chains of known
    blocks (bcg/fusions), each verified against eager on first sight of a shape and run eager where
    it differs; installed only on the CUDA backend. "fast": the torch.compile'd forward (same as
    `compile: true`; not eager's bits). "off": the model's own forward."""

    compile: bool = False
    """Capture the torch.compile'd forward (fewer, fused kernels; see bcg/compiled.py). Replay then
    equals the compiled forward bit for bit, not the eager one. Needs break policy "none"."""

    def __post_init__(self) -> None:
        _choice("bcg.backend", self.backend, BACKENDS, "a backend")
        _choice("bcg.warmup", self.warmup, WARMUPS, "a warm-up")
        self.fusions = normalize_tier(self.fusions)
        if self.warmup_iters < 0:
            raise ValueError(f"bcg.warmup_iters={self.warmup_iters} must be >= 0 (2 is the usual value)")
        if not 1 <= self.max_graphs <= 100_000:
            raise ValueError(f"bcg.max_graphs={self.max_graphs} must be an int in [1, 100000] (32 is the default)")
        if not (math.isfinite(self.max_graph_memory_gb) and self.max_graph_memory_gb >= 0):
            raise ValueError(f"bcg.max_graph_memory_gb={self.max_graph_memory_gb} must be a finite number >= 0 "
                             f"(0 = no bound)")

    @property
    def tier(self) -> str:
        """The effective quality tier: "fast" when compiling, else the `fusions` tier."""
        return "fast" if self.compile else self.fusions

    @property
    def max_graph_bytes(self) -> int:
        return int(self.max_graph_memory_gb * (1 << 30))


def normalize_tier(value: object) -> str:
    """True -> "lossless", False/None -> "off" (Python callers); strings must name a tier."""
    if value is True:
        return "lossless"
    if value is False or value is None:
        return "off"
    if isinstance(value, str) and value in TIERS:
        return value
    raise ValueError(f"bcg.fusions={value!r} is not a tier; use one of {', '.join(TIERS)} (or true/false)")


def _choice(key: str, value: object, allowed: tuple, what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not {what}; choose one of {', '.join(allowed)}")


def validate_policy(policy: BreakPolicy) -> None:
    """Raise ValueError unless `policy` is "none", "attention" or a list of non-empty names."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(
                f"bcg.break_policy={policy!r} is not a policy; use one of {', '.join(POLICIES)} "
                "or a list of module names / class names"
            )
        return
    # OmegaConf hands ListConfig, which is not a list: accept any sequence of strings.
    try:
        names = list(policy)
    except TypeError:
        raise ValueError(
            f"bcg.break_policy={policy!r} must be 'none', 'attention' or a list of module names"
        ) from None
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise ValueError(f"bcg.break_policy has entries that are not module names: {bad!r}")
