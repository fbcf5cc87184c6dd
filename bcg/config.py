"""`RunnerConfig`: every knob of the graph runner, one typed dataclass (registered with Hydra as `bcg`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

BACKENDS = ("auto", "cuda", "tape", "eager")
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
    """Eager forwards on random data before a capture: they let cuBLAS/cuDNN/Triton allocate their
    workspaces and pick algorithms outside the graph."""

    max_entries: int = 32
    """Most captured signatures alive at once; the least recently used is evicted beyond it."""

    max_graph_bytes: int = 0
    """Most memory all live graphs may hold (bytes, pool plus bridges); 0 means no bound. A capture
    that pushes the total over it evicts older entries; one that exceeds it alone runs eager."""

    debug_check_buffers: bool = False
    """Check on every replay that static inputs, bridges and outputs still sit at the addresses the
    graph captured (see the static-buffer rule in `bcg/__init__.py`). Costs a few µs a replay."""

    break_policy: BreakPolicy = field(default="none")
    """"none": the whole forward is one segment. "attention": every attention kernel called from a
    diffusers attention module runs eagerly between segments. A list of module qualified names
    (`transformer_blocks.3.attn2`) or class names (`SanaTransformerBlock`): those forwards run
    eagerly."""

    fusions: Union[bool, str] = "lossless"
    """Quality tier. "lossless" (or true): bit-exact fused Triton kernels for the elementwise chains
    of known blocks (bcg/fusions), each verified against eager on first sight of a shape and run
    eager where it differs; installed only on the CUDA backend. "fast": the torch.compile'd forward
    (same as `compile: true`; not eager's bits). "off" (or false): the model's own forward."""

    compile: bool = False
    """Capture the torch.compile'd forward (fewer, fused kernels; see bcg/compiled.py). Replay then
    equals the compiled forward bit for bit, not the eager one. Needs break_policy "none"."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"bcg.backend={self.backend!r} is not a backend; choose one of {', '.join(BACKENDS)}"
            )
        if self.warmup_iters < 0:
            raise ValueError(f"bcg.warmup_iters={self.warmup_iters} must be >= 0 (2 is the usual value)")
        if self.max_entries < 1:
            raise ValueError(f"bcg.max_entries={self.max_entries} must be >= 1 (32 is the default)")
        if self.max_graph_bytes < 0:
            raise ValueError(f"bcg.max_graph_bytes={self.max_graph_bytes} must be >= 0 (0 = no bound)")
        validate_policy(self.break_policy)
        from .fusions import normalize_tier

        normalize_tier(self.fusions)

    @property
    def tier(self) -> str:
        """The effective quality tier: "fast" when compiling, else the `fusions` tier."""
        from .fusions import normalize_tier

        return "fast" if self.compile else normalize_tier(self.fusions)


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
