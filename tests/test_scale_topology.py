"""Who is which part: torchrun / Slurm environments, unit shard names, summaries, configs."""

from __future__ import annotations

import fnmatch

import pytest

from jobs.worker.ranks import Topology, ranks_from_env, task_from_config, topology
from jobs.telemetry.parts import merge_stats
from jobs.output.layout import unit_shard_glob, unit_shard_pattern
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


def test_unit_shard_names_match_the_common_glob_and_never_collide():
    names = {unit: [unit_shard_pattern(unit).format(index=i) for i in (0, 1, 9999)] for unit in (0, 1, 12, 9_999_999)}
    assert names[0][0] == "shard-u0000000-0000.tar"
    for unit, ns in names.items():
        assert all(fnmatch.fnmatch(n, "shard-*.tar") for n in ns)
        assert all(fnmatch.fnmatch(n, unit_shard_glob(unit)) for n in ns)
        others = [n for u, m in names.items() if u != unit for n in m]
        assert not any(fnmatch.fnmatch(n, unit_shard_glob(unit)) for n in others)


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


@pytest.mark.parametrize("damage", ['{"stat', "[]", "missing status", "status 5"])
def test_a_part_record_damaged_on_disk_is_left_out_and_the_summary_says_running(tmp_path, caplog, damage):
    # Found in session 50: a torn part file crashed the finishing part with a traceback after all its work.
    import json
    import logging

    from jobs.telemetry.parts import part_summary_path, read_part_summaries

    good = _part(0, "complete", 5, 2.0)
    bad = {"missing status": {k: v for k, v in _part(1, "complete", 3, 1.0).items() if k != "status"},
           "status 5": dict(_part(1, "complete", 3, 1.0), status=5)}.get(damage, damage)
    for part, record in ((0, good), (1, bad)):
        path = part_summary_path(tmp_path, part, 2)
        path.parent.mkdir(exist_ok=True)
        path.write_text(record if isinstance(record, str) else json.dumps(record))
    with caplog.at_level(logging.WARNING):
        records = read_part_summaries(tmp_path, 2)
    assert records == [good] and merge_stats(records, parts=2).status == "running"
    assert "part-0001-of-0002.json cannot be read" in caplog.text and "part 1 is left out" in caplog.text


def test_a_parts_workers_at_once_all_count_and_its_earlier_runs_do_not(tmp_path):
    """Two workers of part 0 started by hand wrote one part file between them (session 55): each writes its own.
    A part's earlier run (killed, then resumed) is not counted again: its samples are the resume's "already done"."""
    from jobs.telemetry.parts import drop_earlier_sessions, read_part_summaries, write_part_summary
    from jobs.telemetry.summary import JobStats

    def run(worker, started, ended, written, done_at_start):
        stats = JobStats(status="complete", items_written=written, items_skipped_done=done_at_start,
                         started=f"2026-12-01T10:{started}+00:00", ended=f"2026-12-01T10:{ended}+00:00")
        write_part_summary(tmp_path, 0, 1, stats, done_at_start=done_at_start, worker=worker)

    run("host-1", "00:00", "05:00", 4, 0)  # killed after 4 samples (SIGTERM: it wrote its record)
    run("host-2", "10:00", "20:00", 5, 4)  # the resume, by hand, twice at once:
    run("host-3", "12:00", "18:00", 3, 6)  # started once host-2 had done 2 more (which host-2 counts as written)
    records = read_part_summaries(tmp_path, 1)
    assert sorted(r["items_written"] for r in records) == [3, 5]
    merged = merge_stats(records, parts=1)
    assert (merged.items_written, merged.items_skipped_done, merged.status) == (8, 4, "complete")
    drop_earlier_sessions(tmp_path, 1)
    assert sorted(p.name for p in (tmp_path / "_summary").iterdir()) == ["part-0000-of-0001-host-2.json",
                                                                        "part-0000-of-0001-host-3.json"]


def test_merged_summary_keeps_each_load_parts_slowest():
    slow = dict(_part(0, "complete", 5, 2.0), load_seconds={"imports": 6.0, "weights": 0.4})
    fast = dict(_part(1, "complete", 3, 1.0), load_seconds={"imports": 2.0, "weights": 0.9})
    merged = merge_stats([slow, fast, _part(2, "complete", 1, 1.0)], parts=3)  # part 2: before load_seconds
    assert merged.load_seconds == {"imports": 6.0, "weights": 0.9}


def test_merged_summary_keeps_the_slowest_start_up_and_the_earliest_first_batch():
    # The job's first images came from whichever part got there first; its start-up parts, like the load's,
    # are the slowest part's.
    late = dict(_part(0, "complete", 5, 2.0), startup_seconds={"interpreter": 0.2, "worker_imports": 3.0},
                first_batch_s=19.0, first_batch_ms={"denoise": 900.0})
    early = dict(_part(1, "complete", 3, 1.0), startup_seconds={"interpreter": 0.4, "worker_imports": 2.0},
                 first_batch_s=15.5, first_batch_ms={"denoise": 700.0})
    merged = merge_stats([late, early, _part(2, "complete", 1, 1.0)], parts=3)  # part 2: before session 49
    assert merged.startup_seconds == {"interpreter": 0.4, "worker_imports": 3.0}
    assert merged.first_batch_s == 15.5 and merged.first_batch_ms == {"denoise": 700.0}
    assert merge_stats([_part(0, "complete", 1, 1.0)], parts=1).first_batch_s is None
    unarmed = merge_stats([dict(_part(0, "complete", 1, 1.0), first_batch_ms={"denoise": 5.0})], parts=1)
    assert unarmed.first_batch_s is None and unarmed.first_batch_ms == {"denoise": 5.0}  # a sweep's later job


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


def test_the_closing_line_names_what_was_written_by_kind():
    parts = [dict(_part(0, "complete", 2, 1.0), kinds={"video": 2}), dict(_part(1, "complete", 1, 1.0), kinds={"image": 1})]
    merged = merge_stats(parts, parts=2)
    assert merged.kinds == {"video": 2, "image": 1} and merged.to_json()["kinds"] == {"video": 2, "image": 1}
    assert merged.lines()[0].startswith("bcgen complete: 3 samples written (1 image, 2 videos) of 3 planned")
    videos = merge_stats(parts[:1], parts=1)
    assert videos.lines()[0].startswith("bcgen complete: 2 videos written") and "videos/s" in videos.lines()[1]
    assert merge_stats([_part(0, "complete", 0, 1.0)], parts=1).written() == "0 samples written"  # nothing yet


def test_merged_summary_adds_the_invariant_modes_calls_and_verified_shapes():
    # each worker's process decides its own call shapes (bcg/invariant/verified.py): they add up, as calls do
    inv = [{"enabled": True, "installed": True, "devices": ["cpu", "cuda"], "calls": {"cuda.mm": 10, "cuda.mm.cublas": 9},
            "fast_paths": {"gemm": {"agree": 4, "differ": 0}, "convolution": {"agree": 2, "differ": 1}}},
           {"enabled": True, "installed": True, "devices": ["cpu", "cuda"], "calls": {"cuda.mm": 5},
            "fast_paths": {"gemm": {"agree": 3, "differ": 1}}}]
    merged = merge_stats([dict(_part(i, "complete", 1, 1.0), invariant=inv[i]) for i in (0, 1)], parts=2).invariant
    assert merged["calls"] == {"cuda.mm": 15, "cuda.mm.cublas": 9}
    assert merged["fast_paths"] == {"gemm": {"agree": 7, "differ": 1}, "convolution": {"agree": 2, "differ": 1}}
    plain = merge_stats([dict(_part(i, "complete", 1, 1.0), invariant={"enabled": False}) for i in (0, 1)], parts=2)
    assert "fast_paths" not in plain.invariant


def test_the_closing_summary_says_what_the_invariant_mode_ran():
    from jobs.telemetry.summary import JobStats

    def line(invariant):
        return [x for x in JobStats(invariant=invariant).lines() if "batch-invariant" in x]

    assert line({"enabled": False}) == [] and line({}) == []
    cpu = line({"enabled": True, "devices": ["cpu"], "calls": {"cpu.addmm": 4}})
    assert cpu == ["  batch-invariant kernels: on (cpu); 0 fallback calls"]
    gpu = line({"enabled": True, "devices": ["cpu", "cuda"], "calls": {"cuda.mm": 9, "cuda.sum.fallback": 2},
                "fast_paths": {"gemm": {"agree": 49, "differ": 0}, "convolution": {"agree": 17, "differ": 1}}})
    assert gpu == ["  batch-invariant kernels: on (cpu, cuda); vendor kernels at 49 of 49 GEMM and 17 of 18 "
                   "convolution call shapes (the same bytes); 2 fallback calls (rows they computed may depend "
                   "on their batch)"]
    rows = line({"enabled": True, "devices": ["cpu", "cuda"], "calls": {"cuda.sdpa": 40, "cuda.sdpa.batched": 38},
                 "fast_paths": {"gemm": {"agree": 51, "differ": 0}, "convolution": {"agree": 17, "differ": 1},
                                "attention": {"agree": 6, "differ": 0}}})
    assert rows == ["  batch-invariant kernels: on (cpu, cuda); vendor kernels at 51 of 51 GEMM, 17 of 18 "
                    "convolution and 6 of 6 attention call shapes (the same bytes); 0 fallback calls"]


def test_the_closing_summary_counts_the_verdicts_kept_from_earlier_runs():
    # bcg/invariant/kept.py: a warm run recalls its call shapes' verdicts instead of deciding them
    from jobs.telemetry.summary import JobStats

    fast = {"gemm": {"agree": 51, "differ": 0, "kept": 50}, "convolution": {"agree": 17, "differ": 1, "kept": 18}}
    lines = [x for x in JobStats(invariant={"enabled": True, "devices": ["cpu", "cuda"], "calls": {},
                                            "fast_paths": fast}).lines() if "batch-invariant" in x]
    assert lines == ["  batch-invariant kernels: on (cpu, cuda); vendor kernels at 51 of 51 GEMM and 17 of 18 "
                     "convolution call shapes (the same bytes; 68 verdicts kept from earlier runs); 0 fallback calls"]
    parts = [dict(_part(i, "complete", 1, 1.0), invariant={"enabled": True, "devices": ["cuda"], "calls": {},
                                                            "fast_paths": {"gemm": {"agree": 2, "differ": 0,
                                                                                    "kept": k}}})
             for i, k in ((0, 2), (1, 0))]
    assert merge_stats(parts, parts=2).invariant["fast_paths"] == {"gemm": {"agree": 4, "differ": 0, "kept": 2}}


def test_merged_flops_add_the_parts_rates_and_average_a_sample_over_every_parts_samples():
    """Parts lease different units: a part of long prompts does more work a sample than one of short ones."""
    def flops(per_sample: float, tflops: float) -> dict:
        return {"counted": True, "flops_per_image": per_sample, "flops_per_image_with_prompt_memo": per_sample / 2,
                "tflops": tflops, "peak_tflops": 989.0, "peak_fraction": round(tflops / 989.0, 4)}

    short = dict(_part(0, "complete", 6, 2.0), flops=flops(1.0e14, 400.0))
    long = dict(_part(1, "complete", 2, 2.0), flops=flops(2.0e14, 420.0))
    merged = merge_stats([short, long], parts=2).flops
    assert merged["flops_per_image"] == (6 * 1.0e14 + 2 * 2.0e14) / 8
    assert merged["flops_per_image_with_prompt_memo"] == (6 * 0.5e14 + 2 * 1.0e14) / 8
    assert merged["tflops"] == 820.0 and merged["peak_tflops"] == 2 * 989.0 and merged["parts"] == 2
    assert merged["peak_fraction"] == round(820.0 / 1978.0, 4)
    on_a_cpu = dict(_part(0, "complete", 2, 2.0), flops=dict(flops(3.0e8, 0.0), peak_tflops=None, peak_fraction=None))
    assert merge_stats([on_a_cpu], parts=1).flops["flops_per_image"] == 3.0e8  # counted, the rate rounding to 0
    not_counted = {"counted": False, "reason": "no FLOPs rule for family 'x'"}
    assert merge_stats([dict(_part(0, "complete", 2, 2.0), flops=not_counted)], parts=1).flops == not_counted
