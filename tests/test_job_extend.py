"""`job.extend=true`: a finished output gets the dataset's new rows; its done units stay byte for byte.

Real jobs in subprocesses on the tiny SANA preset (64x64, 2 steps), shards read back with
webdataset; the refusals through the real planner in-process (open_plan), with no generation.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from jobs.errors import UserError
from jobs.models.registry import get_family
from jobs.plan.publish import open_plan
from tests.helpers import compose_cfg, prompts, write_jsonl
from tests.test_job_first_hour import FAST, log_of
from tests.test_resume_kill import cli, shard_keys

pytestmark = pytest.mark.slow


def digests(out):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.glob("shard-*.tar")}


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("extend")
    rows = prompts(6)
    data = write_jsonl(tmp / "rows.jsonl", rows[:4])
    out = tmp / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST]
    first = cli(*args)
    assert first.returncode == 0, log_of(first)
    before = digests(out)
    write_jsonl(data, rows)  # two rows appended
    refused = cli(*args)
    grown = cli(*args, "job.extend=true")
    again = cli(*args, "job.extend=true")
    return tmp, data, out, args, before, refused, grown, again


def test_without_extend_a_grown_dataset_is_another_run(extended):
    *_, refused, _, _ = extended
    assert refused.returncode == 2 and "holds a run with a different dataset or config" in log_of(refused)


def test_extend_generates_only_the_new_rows_and_keeps_the_done_units(extended):
    _, _, out, _, before, _, grown, again = extended
    assert grown.returncode == 0, log_of(grown)
    assert "job.extend: 2 new item(s) in 1 new unit(s) added to the 4 of the run" in log_of(grown)
    assert "2 of 6 planned items left" in log_of(grown)
    assert shard_keys(out) == {f"k{i:03d}": 1 for i in range(6)}
    after = digests(out)
    assert {k: after[k] for k in before} == before  # the first run's shards, untouched
    plan = json.loads((out / "_plan" / "plan.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert plan["items"] == 6 and run["dataset"]["records"] == 6 and run["provenance"]["extended"]
    assert again.returncode == 0 and "nothing generated in this run" in log_of(again), log_of(again)


def _plan_with(tmp, out, rows):
    # As `python -m jobs.plan` plans (no renderer): the run's device part (its jobs' 1 thread) is kept.
    data = write_jsonl(tmp / "changed.jsonl", rows)
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={out}", *FAST, "job.extend=true"])
    return open_plan(cfg, out, get_family(cfg.model.family).spatial_divisor(cfg.model))


def test_extend_refuses_an_edited_or_removed_row(extended, tmp_path):
    import shutil

    tmp, _, out, *_ = extended
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    rows = prompts(7)
    rows[2]["prompt"] = "edited"
    edited = r"key 'k002' at \S*changed.jsonl:3 was planned with other values \(prompt .* -> 'edited'\)"
    with pytest.raises(UserError, match=edited):
        _plan_with(tmp_path, copy, rows)
    with pytest.raises(UserError, match=r"1 row\(s\) the run planned are not in the dataset any more \(keys 'k005'\)"):
        _plan_with(tmp_path, copy, prompts(5))
    assert json.loads((copy / "run.json").read_text()) == json.loads((out / "run.json").read_text())  # unchanged


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_an_extended_runs_run_json_restored_from_its_plan_keeps_its_lineage(extended, tmp_path, damage):
    # The first run's shards carry the run id from before the extend; run.json's lineage names it. A run.json
    # restored from plan.json must keep it, or those shards read as another run's.
    import shutil

    from jobs.output.audit import verify_output

    _, _, out, args, _, _, grown, _ = extended
    assert grown.returncode == 0, log_of(grown)
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    lineage = json.loads((copy / "run.json").read_text())["provenance"]["lineage"]
    assert lineage and json.loads((copy / "_plan" / "plan.json").read_text())["lineage"] == lineage
    if damage == "truncated":
        (copy / "run.json").write_bytes((copy / "run.json").read_bytes()[:40])
    else:
        (copy / "run.json").unlink()
    rerun = cli(*[a if not a.startswith("output_dir=") else f"output_dir={copy}" for a in args], "job.extend=true")
    assert rerun.returncode == 0 and "restoring it" in log_of(rerun), log_of(rerun)
    assert json.loads((copy / "run.json").read_text())["provenance"]["lineage"] == lineage
    report = verify_output(copy)
    assert report.problems == [] and report.foreign == [], (report.problems, report.foreign)
