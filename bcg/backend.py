"""What the engine needs from a graph backend, and how a config picks one.

A backend records segments (`Recorder.begin`/`end`) and replays them (`Step.replay`). The
segment/break/replay logic in `bcg.graph` and `bcg.runner` is written against this protocol only,
so it runs unchanged on CUDA graphs (`bcg.cuda_backend`, the product path) and on the CPU op tape
(`bcg.tape`, which CI uses to test that logic without a GPU).
"""

from __future__ import annotations

import logging
from typing import ContextManager, Protocol

import torch

from .config import RunnerConfig

log = logging.getLogger(__name__)


class Step(Protocol):
    def replay(self) -> None: ...


class Recorder(Protocol):
    """Records the segments of one captured forward; all its segments share one memory pool."""

    def begin(self) -> None:
        """Open a segment: work from here on is recorded, not only run."""

    def end(self) -> Step:
        """Close the open segment. Its outputs must hold real values afterwards (the next break
        reads them), so a backend that only records (CUDA) replays the segment once here."""

    def abort(self) -> None:
        """Close an open segment after an error and drop it."""

    def nbytes(self) -> int:
        """Memory the recorded segments hold (pool, bridges)."""


class Backend(Protocol):
    name: str

    def stream(self) -> ContextManager:
        """Where warm-up and capture run (CUDA: a side stream)."""

    def recorder(self) -> Recorder: ...

    def synchronize(self) -> None: ...

    def released(self) -> None:
        """Called after entries were freed: give their memory back to eager code."""


def resolve_backend(config: RunnerConfig, device: torch.device | None) -> tuple[Backend | None, str]:
    """The backend for `config` and a module on `device`, or None to run eager; plus why."""
    if not config.enabled:
        return None, "disabled by config (bcg.enabled=false)"
    if config.backend == "eager":
        return None, "bcg.backend=eager"
    if config.backend == "tape":
        from .tape import TapeBackend

        return TapeBackend(), "CPU op tape (tests only)"
    cuda_ok = torch.cuda.is_available() and device is not None and device.type == "cuda"
    if config.backend == "cuda" and not cuda_ok:
        raise RuntimeError(
            f"bcg.backend=cuda but the module is on {device} (CUDA available: "
            f"{torch.cuda.is_available()}); move it to a GPU or set bcg.backend=auto"
        )
    if not cuda_ok:
        return None, f"no CUDA device for a module on {device}"
    from .cuda_backend import CudaBackend

    assert device is not None  # cuda_ok
    return CudaBackend(device, watch_inputs=not config.compile), f"CUDA graphs on {device}"
