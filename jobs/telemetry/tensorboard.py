"""Optional TensorBoard logging (`job.tensorboard=DIR`): throughput, the job's progress, graph counters.

One TensorBoard run per worker (`DIR/WORKER/`), a point per batch, x = items this worker wrote:

    throughput/images_per_s      this worker, over the last two minutes
    job/done_items, job/eta_s    the whole job (jobs/telemetry/progress.py), where this worker computes it
    graph/<counter>              the bcg runner's cumulative counters: hits, misses, captures, ...

`tensorboard` is an optional dependency (`pip install -e '.[tensorboard]'`); the job checks for it
before loading a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from jobs.errors import UserError


def check_tensorboard(directory: Optional[str]) -> None:
    if directory is None:
        return
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
    except ImportError:
        raise UserError(f"job.tensorboard={directory!r} needs the tensorboard package, which is not installed: "
                        f"pip install -e '.[tensorboard]' (or pip install tensorboard), or leave job.tensorboard "
                        f"unset") from None


class TensorBoardLog:
    def __init__(self, directory: str, worker: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(directory) / worker), flush_secs=10)

    def add(self, step: int, rate: float, graph: dict, view) -> None:
        w = self.writer
        w.add_scalar("throughput/images_per_s", rate, step)
        if view is not None:
            w.add_scalar("job/done_items", view.done, step)
            if view.eta_s is not None:
                w.add_scalar("job/eta_s", view.eta_s, step)
        for name, value in graph.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                w.add_scalar(f"graph/{name}", value, step)

    def close(self) -> None:
        self.writer.close()
