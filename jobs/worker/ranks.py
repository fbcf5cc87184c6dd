"""One job over many processes: torchrun ranks inside each Slurm array task (or `job.partition=I/N`).

    global part = task_index * world + rank        of        task_count * world

Every process is a worker that leases work units of the one plan of output_dir (jobs/worker/),
so processes never exchange work and need no fixed share. They meet only where output_dir must
agree: rank 0 joins or makes the plan (and claims run.json) before the others read it, and rank 0
writes index + summary.json after every rank is done. The part names a worker's summary file and
staggers where workers start leasing; shards are named by unit, so names never collide.

The process group (nccl on CUDA, gloo on CPU) carries nothing but these meetings; a separate gloo
group carries them even under nccl, so a barrier never holds a GPU stream and needs no device.
Array tasks do not share a process group: they share output_dir, through file locks
(jobs/output/claim.py). Their summaries meet in files (jobs/telemetry/parts.py).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

import torch

from jobs.errors import UserError
from jobs.worker.model import resolve_device

log = logging.getLogger(__name__)

SLURM_ARRAY = "slurm_array"


@dataclass(frozen=True)
class Topology:
    """Where this process sits: its rank in its process group, and its group's array task."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    task_index: int = 0
    task_count: int = 1

    @property
    def part(self) -> int:
        return self.task_index * self.world + self.rank

    @property
    def parts(self) -> int:
        return self.task_count * self.world

    @property
    def leader(self) -> bool:
        """Rank 0 of its process group: claims output_dir and writes index + summary for the group."""
        return self.rank == 0

    def __str__(self) -> str:
        return (f"part {self.part} of {self.parts} "
                f"(task {self.task_index}/{self.task_count}, rank {self.rank}/{self.world})")


def _env_int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise UserError(f"environment variable {name}={environ[name]!r} is not an integer; "
                         f"unset it or launch with torchrun / srun, which set it") from None


def ranks_from_env(environ: Mapping[str, str]) -> Tuple[int, int, int]:
    """(rank, world, local_rank) as torchrun sets them; (0, 1, 0) for a plain process."""
    if "RANK" not in environ and "WORLD_SIZE" not in environ:
        return 0, 1, 0
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in environ]
    if missing:
        raise UserError(f"{' and '.join(missing)} unset while {'RANK' if 'RANK' in environ else 'WORLD_SIZE'} is set; "
                         f"launch with `torchrun --nproc-per-node N -m jobs.generate ...`")
    rank, world = _env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE")
    local = _env_int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
    if not (world >= 1 and 0 <= rank < world and local >= 0):
        raise UserError(f"RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local} are inconsistent: "
                         f"need 0 <= RANK < WORLD_SIZE")
    return rank, world, local


def export_submitit_ranks(environ) -> None:
    """A submitit job with several tasks (hydra/launcher tasks_per_node > 1) is a process group too:
    export torchrun's variables from submitit's environment, so one code path serves both."""
    if "RANK" in environ or "SUBMITIT_FOLDER" not in environ:
        return
    import submitit

    if submitit.JobEnvironment().num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def task_from_config(partition: str, environ: Mapping[str, str]) -> Tuple[int, int]:
    """`job.partition`: `I/N`, or `slurm_array` for the task's place in its Slurm job array.

    The array is opt-in, never guessed: Hydra's submitit launcher runs *every* multirun as an
    array, and a sweep over, say, guidance scales must not split each job's dataset in two.
    """
    from jobs.config import parse_partition

    if partition != SLURM_ARRAY:
        return parse_partition(partition)
    names = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT")
    missing = [n for n in names if n not in environ]
    if missing:
        raise UserError(f"job.partition={SLURM_ARRAY} but {', '.join(missing)} unset: this is not a Slurm array task. "
                         f"Submit with `sbatch --array=0-N`, or pass job.partition=I/N")
    task, lo, hi, count = (_env_int(environ, n) for n in names)
    if hi - lo + 1 != count:
        raise UserError(f"job.partition={SLURM_ARRAY} needs a contiguous array (--array=0-{count - 1}); "
                         f"this one has {count} tasks in {lo}..{hi}. Use job.partition=I/N instead")
    return task - lo, count


def topology(partition: str, environ: Optional[Mapping[str, str]] = None) -> Topology:
    environ = os.environ if environ is None else environ
    export_submitit_ranks(environ)
    rank, world, local = ranks_from_env(environ)
    task, tasks = task_from_config(partition, environ)
    return Topology(rank=rank, world=world, local_rank=local, task_index=task, task_count=tasks)


def pick_device(name: str, local_rank: int) -> torch.device:
    """This rank's device: `cuda:<local_rank>` (modulo the visible count, for one-GPU-per-task binds)."""
    device = resolve_device(name)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return device


class Group:
    """The meetings between ranks of one process group; every method is a no-op for world 1."""

    def __init__(self, topo: Topology, device: torch.device, timeout_min: float):
        self.topo = topo
        self._ctrl = None
        if topo.world == 1:
            return
        import torch.distributed as dist

        # Ranks that finish early wait at the last barrier for the slowest: the timeout bounds a
        # straggler, not a message, so it is the job's time limit rather than seconds.
        timeout = datetime.timedelta(minutes=timeout_min)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None)
        self._ctrl = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else dist.group.WORLD
        log.info("process group up: %s, backend %s, device %s", topo, backend, device)

    def barrier(self) -> None:
        if self._ctrl is not None:
            import torch.distributed as dist

            dist.barrier(group=self._ctrl)

    def agree(self, step: Callable[[], None], leader_only: bool = False) -> None:
        """Run `step` (on rank 0 only, or on every rank), then meet: when any rank's step raised,
        every rank raises (UserError for bad input, so all exit 2), and none is left waiting at a
        later barrier for a rank that is gone."""
        failure: Optional[BaseException] = None
        if self.topo.leader or not leader_only:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
                if self._ctrl is None:
                    raise
                failure = e
        if self._ctrl is None:
            return
        import torch.distributed as dist

        reports = [None] * self.topo.world
        mine = None if failure is None else (isinstance(failure, UserError), f"{type(failure).__name__}: {failure}")
        dist.all_gather_object(reports, mine, group=self._ctrl)
        if failure is not None:
            raise failure
        for rank, report in enumerate(reports):
            if report:
                bad_input, message = report
                raise (UserError if bad_input else RuntimeError)(f"rank {rank} failed: {message}")

    def close(self) -> None:
        if self._ctrl is not None:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._ctrl = None
