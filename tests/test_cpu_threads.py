"""A CPU run's identity holds its thread count (it changes bytes); a GPU run's does not. The count
is the renderer's: a run claimed by a job that renders nothing (`python -m jobs.plan`) has its
device part pending until its first worker settles it (jobs/plan/publish.py), and with it how the
run batches (bcg.invariant=null: the batch-invariant mode on with CUDA, the pool in the identity on
the CPU)."""

from __future__ import annotations

import json

import pytest

from jobs.models.registry import get_family
from jobs.output.claim import open_run
from jobs.plan.identity import DEVICE_PENDING, Renderer, run_identity
from jobs.plan.publish import open_plan
from tests.helpers import compose_cfg, prompts, write_jsonl

CPU2, CPU1, GPU = Renderer("cpu", 2), Renderer("cpu", 1), Renderer("cuda", 2)


def identity(device: str, renderer=None) -> dict:
    return run_identity(compose_cfg(["output_dir=/tmp/x", f"device={device}"]), "digest", 3,
                        device=None if renderer is None else renderer.identity())


def test_a_cpu_run_resumed_with_another_thread_count_is_refused(tmp_path):
    first = identity("cpu", CPU2)
    assert first["cpu_threads"] == 2
    open_run(tmp_path, first, overwrite=False)
    open_run(tmp_path, identity("cpu", CPU2), overwrite=False)  # same count: resumes
    with pytest.raises(ValueError, match="cpu_threads: 2 -> 1"):
        open_run(tmp_path, identity("cpu", CPU1), overwrite=False)


def test_a_gpu_run_leaves_the_thread_count_out():
    one = identity("auto", Renderer("cuda", 1))
    assert "cpu_threads" not in one and one == identity("auto", Renderer("cuda:0", 2))


def test_a_job_that_renders_nothing_leaves_the_device_part_pending():
    assert {k: identity("auto")[k] for k in DEVICE_PENDING} == DEVICE_PENDING
    assert {k: identity("cpu")[k] for k in DEVICE_PENDING} == DEVICE_PENDING
    gpu = identity("cuda")  # known without torch: a CUDA run records no thread count
    assert "device" not in gpu and "cpu_threads" not in gpu and gpu == identity("cuda", GPU)


@pytest.fixture
def planned(tmp_path):
    """A plan made as `python -m jobs.plan` makes it: no renderer."""
    data = write_jsonl(tmp_path / "p.jsonl", prompts(3))
    out = tmp_path / "out"
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={out}"])
    divisor = get_family(cfg.model.family).spatial_divisor(cfg.model)

    def plan(renderer=None):
        return open_plan(cfg, out, divisor, renderer=renderer)

    made = plan()
    assert made.identity["device"] == "pending" and "cpu_threads" not in made.identity
    return out, plan


def _run(out):
    return json.loads((out / "run.json").read_text())


def _planned(out):
    return json.loads((out / "_plan" / "plan.json").read_text())["identity"]


def test_the_first_cpu_worker_settles_its_thread_count(planned):
    out, plan = planned
    pending_id = _run(out)
    joined = plan(CPU2)
    run = _run(out)
    assert joined.identity["cpu_threads"] == 2 and "device" not in joined.identity
    assert run["cpu_threads"] == 2 and "device" not in run and _planned(out) == joined.identity
    assert run["provenance"]["device_settled"] and run["provenance"]["lineage"]  # the pending id kept
    assert run["batching"]["batch_sizes"] == [8] and "invariant" not in run  # the CPU's kernels: the pool counts
    assert {k: v for k, v in run.items() if k not in ("provenance", "cpu_threads", "batching")} == \
        {k: v for k, v in pending_id.items() if k not in ("provenance", "device")}
    plan(CPU2)  # the same count: joins
    with pytest.raises(ValueError, match="cpu_threads: 2 -> 1"):
        plan(CPU1)
    with pytest.raises(ValueError, match="cpu_threads: 2 -> null"):
        plan(GPU)  # a GPU would mix another rendering into a CPU run
    assert plan().identity == joined.identity  # the planner joins the settled run as it is
    assert _run(out) == run


def test_the_first_gpu_worker_settles_a_gpu_run(planned):
    out, plan = planned
    joined = plan(GPU)
    assert "device" not in joined.identity and "cpu_threads" not in joined.identity
    assert "device" not in _run(out) and "cpu_threads" not in _run(out)
    assert joined.identity["invariant"] is True and "batching" not in joined.identity  # bcg.invariant=null on CUDA
    plan(Renderer("cuda:1", 8))  # another GPU of any host joins
    with pytest.raises(ValueError, match="cpu_threads: null -> 2"):
        plan(CPU2)


def test_a_worker_whose_config_differs_settles_nothing(planned, tmp_path):
    out, _ = planned
    cfg = compose_cfg([f"dataset.path={tmp_path / 'p.jsonl'}", f"output_dir={out}", "sampling.steps=3"])
    with pytest.raises(ValueError, match="sampling.steps: 8 -> 3"):
        open_plan(cfg, out, get_family(cfg.model.family).spatial_divisor(cfg.model), renderer=CPU2)
    assert _run(out)["device"] == "pending" and _planned(out)["device"] == "pending"


def _planner(out, data, *overrides):
    """`python -m jobs.plan` with `overrides`, in process: no renderer."""
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={out}", *overrides])
    return open_plan(cfg, out, get_family(cfg.model.family).spatial_divisor(cfg.model))


def test_a_planner_batching_otherwise_than_the_settled_run_is_refused_at_plan_time(planned, tmp_path):
    """The run's renderer is known once settled, so how the planner's own config batches there is too:
    another pool or mode is refused by `jobs.plan`, not first by the workers it planned for."""
    out, plan = planned
    data = tmp_path / "p.jsonl"
    plan(CPU2)
    run = _run(out)
    with pytest.raises(ValueError, match=r"batching.batch_sizes: \[8\] -> \[1\]"):
        _planner(out, data, "bcg.batch_sizes=[1]")
    with pytest.raises(ValueError, match="invariant: null -> true"):
        _planner(out, data, "bcg.invariant=true")
    assert _planner(out, data, "bcg.invariant=false").identity == plan(CPU2).identity  # off: the CPU's default
    assert _run(out) == run  # nothing refused was written


def test_a_planner_turning_the_mode_off_in_a_settled_gpu_run_is_refused(planned, tmp_path):
    """A GPU run holds the mode (bcg.invariant=null on CUDA), so the pool is a speed setting there and
    the planner may change it; turning the mode off would batch otherwise, and is refused."""
    out, plan = planned
    data = tmp_path / "p.jsonl"
    plan(GPU)  # bcg.invariant=null on CUDA: the mode, no pool
    with pytest.raises(ValueError, match="invariant: true -> null") as refused:
        _planner(out, data, "bcg.invariant=false")
    assert "batching" in str(refused.value)
    assert _planner(out, data, "bcg.batch_sizes=[1,2]").identity["invariant"] is True  # the pool: speed only


def test_a_lost_run_json_is_restored_from_the_settled_plan(planned):
    out, plan = planned
    settled = plan(CPU2).identity
    (out / "run.json").unlink()
    plan(CPU2)
    assert {k: v for k, v in _run(out).items() if k != "provenance"} == settled
