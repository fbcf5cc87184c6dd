"""What the planner counts and what it keeps: rows, truncated prompts, samples a row, kept fields.

The real planner (jobs/plan/build.py) over files the tests write, with the real SANA tokenizer
of the tiny preset; both lanes (Arrow's fast JSONL lane, and the readers' row-by-row path).
"""

from __future__ import annotations

import json
import logging

import pyarrow.parquet as pq
import pytest

from jobs.dataset.rules import unknown_fields_message
from jobs.models.registry import get_family
from jobs.output.layout import unit_name
from jobs.plan import derive_seed
from jobs.plan.build import plan_dataset
from tests.helpers import compose_cfg, prompts, write_jsonl

LONG = " ".join(["word"] * 400)  # past sana_tiny's 300 tokens: truncated


def plan(tmp_path, rows, *overrides, name="p.jsonl"):
    data = write_jsonl(tmp_path / name, rows)
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", *overrides])
    work = tmp_path / f"work-{len(list(tmp_path.iterdir()))}"
    result = plan_dataset(cfg, get_family(cfg.model.family).spatial_divisor(cfg.model), work)
    return result, work


def unit_rows(work, result):
    rows = []
    for u in result.manifest.units:
        rows += pq.read_table(work / f"{unit_name(u.id)}.parquet").to_pylist()
    return sorted(rows, key=lambda r: r["key"])


@pytest.mark.parametrize("lane", ["fast", "rows"])
def test_a_duplicate_key_row_is_one_row_and_one_bad_row(tmp_path, caplog, lane):
    rows = prompts(5) + [{"key": "k001", "prompt": "again"}]
    if lane == "rows":
        rows[0]["negative_prompt"] = 3  # a bad row: the fast lane declines the file
    caplog.set_level(logging.INFO, "jobs.plan")
    result, _ = plan(tmp_path, rows, "dataset.on_error=skip")
    bad = 1 + (lane == "rows")
    assert result.manifest.n_items == 6 - bad and len(result.errors) == bad
    line = next(r.message for r in caplog.records if r.message.startswith("plan: ") and " rows -> " in r.message)
    assert line.startswith(f"plan: 6 rows -> {6 - bad} items") and f"{bad} bad rows" in line


def test_truncated_counts_only_the_planned_items(tmp_path):
    rows = prompts(8)
    for i in (1, 5, 6, 7):  # one inside the limit, three past it
        rows[i]["prompt"] = LONG
    full, _ = plan(tmp_path, rows)
    assert full.manifest.truncated == 4
    limited, work = plan(tmp_path, rows, "dataset.limit=4")
    assert limited.manifest.n_items == 4 and limited.manifest.truncated == 1
    assert sum(r["truncated"] for r in unit_rows(work, limited)) == 1  # what the worker's summary will count


def test_images_per_prompt_makes_n_keyed_samples_a_row_each_with_its_seed(tmp_path):
    rows = [{"key": "a", "prompt": "a red star"}, {"key": "b", "prompt": "a blue square", "seed": 41},
            {"prompt": "keyless"}, {"key": "c", "prompt": "past the limit"}]
    result, work = plan(tmp_path, rows, "sampling.images_per_prompt=3", "dataset.limit=3")
    got = {r["key"]: r for r in unit_rows(work, result)}
    assert sorted(got) == ["a-0", "a-1", "a-2", "b-0", "b-1", "b-2", "p-000003-0", "p-000003-1", "p-000003-2"]
    assert [got[f"b-{i}"]["seed"] for i in range(3)] == [41, 42, 43]  # the row's seed, then the next ones
    assert [got[f"a-{i}"]["seed"] for i in range(3)] == [derive_seed(0, f"a-{i}") for i in range(3)]
    assert {got[f"a-{i}"]["prompt"] for i in range(3)} == {"a red star"} and got["a-1"]["line"] == 1
    assert result.manifest.n_items == 9 and result.manifest.dataset["records"] == 9


def test_images_per_prompt_one_keeps_keys_and_the_run_identity(tmp_path):
    from jobs.plan.identity import run_identity

    result, work = plan(tmp_path, prompts(2))
    assert [r["key"] for r in unit_rows(work, result)] == ["k000", "k001"]
    one = run_identity(compose_cfg(["output_dir=/tmp/x"]), "d", 2)
    three = run_identity(compose_cfg(["output_dir=/tmp/x", "sampling.images_per_prompt=3"]), "d", 2)
    assert "images_per_prompt" not in one["sampling"] and three["sampling"]["images_per_prompt"] == 3


def test_a_duplicate_row_with_several_samples_is_one_bad_row(tmp_path):
    rows = [{"key": "a", "prompt": "x"}, {"key": "a", "prompt": "y"}]
    result, _ = plan(tmp_path, rows, "sampling.images_per_prompt=2", "dataset.on_error=skip")
    assert result.manifest.n_items == 2 and [e.line for e in result.errors] == [2]


def test_unknown_field_names_the_nearest_known_one(tmp_path, caplog):
    assert "'guidance' (did you mean 'guidance_scale'?)" in unknown_fields_message({"guidance"}, "prompt", "key")
    assert "did you mean" not in unknown_fields_message({"url"}, "prompt", "key")
    caplog.set_level(logging.WARNING)
    plan(tmp_path, [{"key": "a", "prompt": "x", "guidance": 3.0, "url": "http://e/1"}])
    warning = " ".join(r.message for r in caplog.records if r.levelno == logging.WARNING)
    assert "'guidance' (did you mean 'guidance_scale'?), 'url'" in warning
    assert "dataset.keep_fields=[guidance,url]" in warning


def test_kept_fields_ride_in_the_units_and_stop_the_warning(tmp_path, caplog):
    rows = [{"key": "a", "prompt": "x", "url": "http://e/1", "meta": {"w": [1, 2]}, "junk": 1},
            {"key": "b", "prompt": "y"}]
    caplog.set_level(logging.WARNING)
    result, work = plan(tmp_path, rows, "dataset.keep_fields=[url,meta]")
    got = {r["key"]: r for r in unit_rows(work, result)}
    assert json.loads(got["a"]["extra"]) == {"url": "http://e/1", "meta": {"w": [1, 2]}}
    assert got["b"]["extra"] is None
    warning = " ".join(r.message for r in caplog.records if r.levelno == logging.WARNING)
    assert "'junk'" in warning and "'url'" not in warning


def test_keep_fields_refuses_names_bcgen_uses():
    from jobs.errors import UserError
    from jobs.preflight import check_config

    with pytest.raises(UserError, match="'seed' is a field bcgen reads already"):
        compose_cfg(["dataset.keep_fields=[seed]"])
    with pytest.raises(UserError, match="given twice"):
        compose_cfg(["dataset.keep_fields=[a,a]"])
    with pytest.raises(UserError, match="'mode' is a field every sample's json already has"):
        check_config(compose_cfg(["dataset.keep_fields=[mode]", "output_dir=/tmp/bcgen-keep-check"]))
