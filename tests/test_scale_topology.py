"""Who does which part: torchrun / Slurm environments, shard names, partition shares, summaries, configs."""

from __future__ import annotations

import fnmatch

import pytest

from jobs.distributed import (Topology, merge_stats, ranks_from_env, shard_glob, shard_pattern, task_from_config,
                              topology)
from jobs.partition import batch_work, take_partition
from jobs.plan import Item, Signature, build_plan
from tests.helpers import CONF_DIR, compose_cfg

ARRAY = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_MAX": "11",
         "SLURM_ARRAY_TASK_COUNT": "8"}


def test_array_task_times_rank_gives_the_global_part():
    topo = topology("2/3", {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (topo.part, topo.parts, topo.leader) == (9, 12, False)
    topo = topology("slurm_array", dict(ARRAY, RANK="0", WORLD_SIZE="8", LOCAL_RANK="0"))
    assert (topo.task_index, topo.task_count, topo.part, topo.parts) == (3, 8, 24, 64)
    assert topology("0/1", {}) == Topology()  # a plain process: one part


@pytest.mark.parametrize("env, needle", [
    ({"RANK": "0"}, "WORLD_SIZE unset"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "0 <= RANK < WORLD_SIZE"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
])
def test_bad_rank_environment_is_named(env, needle):
    with pytest.raises(ValueError, match=needle):
        ranks_from_env(env)


def test_slurm_array_is_opt_in_and_checked():
    assert task_from_config("1/4", ARRAY) == (1, 4)  # an explicit I/N wins over the array
    with pytest.raises(ValueError, match="not a Slurm array task"):
        task_from_config("slurm_array", {})
    with pytest.raises(ValueError, match="contiguous"):
        task_from_config("slurm_array", dict(ARRAY, SLURM_ARRAY_TASK_COUNT="3"))
    with pytest.raises(ValueError, match="slurm_array"):
        compose_cfg(["job.partition=4/4", "output_dir=/tmp/x"])
    assert compose_cfg(["job.partition=slurm_array", "output_dir=/tmp/x"]).job.partition == "slurm_array"


def test_shard_names_match_the_common_glob_and_never_collide():
    names = {(part, parts): [shard_pattern(part, parts).format(index=i) for i in (0, 1, 1234567)]
             for parts in (1, 3, 1000, 12000) for part in {0, 1, parts - 1} if part < parts}
    flat = [n for ns in names.values() for n in ns]
    assert all(fnmatch.fnmatch(n, "shard-*.tar") for n in flat)
    assert names[(0, 1)][0] == "shard-000000.tar"
    for (part, parts), ns in names.items():
        own = shard_glob(part, parts)
        assert all(fnmatch.fnmatch(n, own) for n in ns)
        # another layout may share the name pattern (resume with a new world size), never the same
        # names within one layout
        others = [n for (p, ps), m in names.items() if ps == parts and p != part for n in m]
        assert not any(fnmatch.fnmatch(n, own) for n in others), (own, others)
    assert not fnmatch.fnmatch("shard-r0001-000000.tar", shard_glob(0, 1))


def _plan(n: int):
    sigs = [Signature(64, 64, 64, 2, 4.5, True, "float32"), Signature(128, 128, 64, 2, 4.5, True, "float32")]
    items = [Item(f"k{i:04d}", "p", "", i, sigs[i % 3 == 0], 4, False, f"f:{i}") for i in range(n)]
    return build_plan(items, [1, 2, 4, 8], True)


def test_parts_of_tasks_x_ranks_cover_the_plan_once_and_balance_work():
    plan = _plan(500)
    tasks, world = 3, 4
    shares = [take_partition(plan, Topology(rank=r, world=world, task_index=t, task_count=tasks).part, tasks * world)
              for t in range(tasks) for r in range(world)]
    keys = [k for s in shares for k in s.keys()]
    assert sorted(keys) == sorted(plan.keys())
    work = [sum(batch_work(b) for b in s.batches) for s in shares]
    ideal, biggest = sum(work) / len(work), max(batch_work(b) for b in plan.batches)
    # A batch belongs to the share holding its midpoint: each of a share's two ends is off by at
    # most half a batch, so balance is by work (a 128^2 batch weighs 4 of 64^2), not item count.
    assert all(abs(w - ideal) <= biggest for w in work), (work, ideal, biggest)


def _part(part: int, status: str, written: int, gen: float) -> dict:
    return {"part": part, "status": status, "items_planned": written, "items_written": written,
            "items_skipped_done": 1, "bad_rows": 2, "truncated_prompts": 0, "nonfinite_keys": [f"n{part}"],
            "oom_splits": 0, "modes": {"eager": written}, "signatures": {"64x64": written},
            "stage_seconds": {"generate": gen}, "graph": {"hits": 3, "mode": "eager"}, "sink": {"bytes": 10},
            "shards": 1, "device": f"cuda:{part}", "model": "m", "output_dir": "/o"}


def test_merged_summary_adds_counts_keeps_dataset_counts_and_the_worst_status():
    merged = merge_stats([_part(0, "complete", 5, 2.0), _part(1, "preempted", 3, 7.0)], parts=2)
    assert (merged.status, merged.items_written, merged.items_skipped_done, merged.bad_rows) == ("preempted", 8, 2, 2)
    assert merged.stage_seconds == {"generate": 7.0} and merged.graph["hits"] == 6 and merged.modes["eager"] == 8
    assert merged.nonfinite_keys == ["n0", "n1"] and merged.device == "cuda:0, cuda:1"
    assert merge_stats([_part(0, "complete", 5, 2.0)], parts=2).status == "running"  # part 1 not reported
    assert merge_stats([_part(0, "complete", 5, 2.0), _part(1, "complete", 1, 1.0)], parts=2).status == "complete"


def test_cluster_preset_composes_to_a_slurm_array_of_every_partition():
    from hydra import compose, initialize_config_dir

    from jobs.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("generate", overrides=["+cluster=slurm_h200", "output_dir=/data/x"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == launcher.gpus_per_node == 8  # one rank per GPU
    assert launcher.max_num_timeout > 0 and launcher.signal_delay_s > 0 and launcher.timeout_min > 0
    parts = str(cfg.hydra.sweeper.params["job.partition"]).split(",")
    n = len(parts)
    assert parts == [f"{i}/{n}" for i in range(n)] and launcher.array_parallelism <= n
    typed = compose_cfg(["+cluster=slurm_h200", "output_dir=/data/x"])  # the rest is a valid job config
    assert typed.device == "cuda" and typed.job.progress is False
