"""One job over many processes: torchrun ranks inside each Slurm array task (or `job.partition=I/N`).

    global part = task_index * world + rank        of        task_count * world

Every process is a worker that leases work units of the one plan of output_dir (jobs/worker/),
so processes never exchange work and need no fixed share. They meet only where output_dir must
agree: rank 0 joins or makes the plan (and claims run.json) before the others read it, and rank 0
writes index + summary.json after every rank is done. The part names a worker's summary file and
staggers where workers start leasing; shards are named by unit, so names never collide.

The process group (nccl on CUDA, gloo on CPU) carries nothing but these meetings; a separate gloo
group carries them even under nccl, so a barrier never holds a GPU stream and needs no device.
Array tasks do not share a process group: they share output_dir, through file locks (resume.py).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

import torch

from jobs.errors import UserError

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
        return f"part {self.part} of {self.parts} (task {self.task_index}/{self.task_count}, rank {self.rank}/{self.world})"


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
    from jobs.engine import resolve_device

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


# -- one summary for all parts ----------------------------------------------------------------
# Every part writes its own stats file; whoever finishes a group merges the files of the current
# layout. Files, not a gather: a failing rank still leaves its record, and array tasks, which
# share no process group, merge the same way.

SUMMARY_DIR = "_summary"
STATUS_ORDER = ("failed", "interrupted", "preempted", "running", "complete")  # worst first


def part_summary_path(output_dir, part: int, parts: int):
    from pathlib import Path

    return Path(output_dir) / SUMMARY_DIR / f"part-{part:04d}-of-{parts:04d}.json"


def write_part_summary(output_dir, topo: Topology, stats) -> None:
    import json

    from sinks.atomic import atomic_write_bytes

    path = part_summary_path(output_dir, topo.part, topo.parts)
    path.parent.mkdir(exist_ok=True)
    data = dict(stats.to_json(), part=topo.part, parts=topo.parts)
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def read_part_summaries(output_dir, parts: int) -> list:
    import json

    out = []
    for part in range(parts):
        path = part_summary_path(output_dir, part, parts)
        if path.exists():
            out.append(json.loads(path.read_text()))
    return out


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = out.get(k, 0) + v
        else:
            out.setdefault(k, v)
    return out


def merge_stats(records: list, parts: int):
    """Part records -> one JobStats: counts add up, stage times are the slowest part's (wall
    clock), dataset-wide counts (bad rows) are taken once, and a missing part reads as running."""
    from collections import Counter

    from jobs.summary import JobStats

    statuses = {r["status"] for r in records} | ({"running"} if len(records) < parts else set())
    merged = JobStats(status=next(s for s in STATUS_ORDER if s in statuses))
    merged.modes = Counter()
    merged.kinds = Counter()
    for r in records:
        for name in ("items_planned", "items_written", "items_skipped_done", "truncated_prompts", "oom_splits",
                     "shards"):
            setattr(merged, name, getattr(merged, name) + r[name])
        merged.bad_rows = max(merged.bad_rows, r["bad_rows"])  # every part read the same dataset
        merged.nonfinite_keys += r["nonfinite_keys"]
        merged.modes.update(r["modes"])
        merged.kinds.update(r.get("kinds", {}))
        merged.signatures = _add(merged.signatures, r["signatures"])
        merged.graph = _add(merged.graph, r["graph"])
        merged.sink = _add(merged.sink, r["sink"])
        for stage, s in r["stage_seconds"].items():
            merged.stage_seconds[stage] = max(merged.stage_seconds.get(stage, 0.0), s)
        merged.model, merged.output_dir = r["model"], r["output_dir"]
        merged.gpu_stage_ms = _add(merged.gpu_stage_ms, r.get("gpu_stage_ms", {}))
        merged.capture_policy += r.get("capture_policy", [])
        merged.overlap = merged.overlap or r.get("overlap", False)
        merged.batching = merged.batching or r.get("batching", {})  # one published pick per output_dir
    busy = [r["gpu_busy"] for r in records if r.get("gpu_busy") is not None]
    merged.gpu_busy = sum(busy) / len(busy) if busy else None
    merged.device = ", ".join(sorted({r["device"] for r in records if r["device"]}))
    return merged
