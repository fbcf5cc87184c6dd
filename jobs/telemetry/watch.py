"""Everything that watches one worker generate: the job's bar and log lines, its timeline, its
TensorBoard run and the GPU-busy sampler, fed one finished batch at a time.

    watch = Watch(output_dir, worker_name, planned, inflight, job_cfg, show_job, device)
    with watch:                         # the GPU monitor samples while generating
        watch.batch(n, signature, mode, batch_size, graph_stats, counters)
    watch.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from jobs.output.layout import PLAN_DIR
from jobs.telemetry.gpu_monitor import GpuMonitor
from jobs.telemetry.progress import Progress, SharedProgress
from jobs.telemetry.tensorboard import TensorBoardLog
from jobs.telemetry.timeline import Timeline


class Watch:
    def __init__(self, output_dir: Path, worker: str, planned: int, inflight: Callable[[], Dict[int, int]],
                 bar: bool, log_every_s: float, tensorboard: Optional[str], show_job: bool, device: torch.device):
        self.timeline = Timeline(output_dir, worker)
        # One bar per node, for the whole job; every worker publishes its counts, and other ranks
        # still log their own progress lines every log_every_s.
        shared = SharedProgress(output_dir, output_dir / PLAN_DIR, worker, planned, inflight)
        board = TensorBoardLog(tensorboard, worker) if tensorboard else None
        self.progress = Progress(shared, bar, log_every_s, job_view=show_job, tensorboard=board)
        self.monitor = GpuMonitor(device)

    def __enter__(self) -> "Watch":
        self.monitor.__enter__()
        self.timeline.start()
        return self

    def __exit__(self, *exc) -> None:
        self.monitor.__exit__(*exc)

    def batch(self, items: int, signature: str, mode: str, batch_size: int, graph: dict, counters) -> None:
        """One batch handed to the sink; `graph` is the runner's stats ({} without one), `counters`
        its cumulative counters (None without one)."""
        self.progress.update(items, signature, graph)
        self.timeline.record(items, signature, mode, batch_size, counters)

    def close(self) -> None:
        self.progress.close()
        self.timeline.close()

    def gpu_busy(self) -> Optional[float]:
        return self.monitor.busy()
