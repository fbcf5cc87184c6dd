"""`dataset.format=hf`: a Hugging Face dataset the test saves (save_to_disk), a DatasetDict's split,
and a Hub dataset id read from a local HF cache the test builds, all planned by the real planner."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.dataset import DatasetError
from jobs.errors import UserError
from jobs.models.registry import get_family
from jobs.plan.build import dataset_files, plan_dataset
from tests.helpers import compose_cfg
from tests.test_plan_counts import unit_rows

# the hf extra: .[test] has it; the GPU machine, which runs `pytest -m gpu` over every module, does not
datasets = pytest.importorskip("datasets")


ROWS = {"key": ["a", "b", "c"], "prompt": ["a red star", "a blue square", "a green circle"], "seed": [1, None, 3],
        "source_url": ["u1", "u2", "u3"]}


def plan(tmp_path, *overrides):
    cfg = compose_cfg([f"output_dir={tmp_path / 'out'}", *overrides])
    work = tmp_path / f"work-{len(list(tmp_path.iterdir()))}"
    return plan_dataset(cfg, get_family(cfg.model.family).spatial_divisor(cfg.model), work), work, cfg


def test_a_saved_dataset_is_planned_row_by_row(tmp_path):
    folder = tmp_path / "ds"
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(folder))
    result, work, cfg = plan(tmp_path, f"dataset.path={folder}", "dataset.keep_fields=[source_url]")
    assert [f.fmt for f in dataset_files(cfg)] == ["hf"]  # format=auto knows a save_to_disk folder
    got = {r["key"]: r for r in unit_rows(work, result)}
    assert [got[k]["prompt"] for k in "abc"] == ROWS["prompt"]
    assert got["a"]["seed"] == 1 and got["c"]["seed"] == 3 and got["b"]["line"] == 2
    assert got["b"]["extra"] == '{"source_url": "u2"}'
    assert result.manifest.dataset["format"] == "hf"
    again, _, _ = plan(tmp_path, f"dataset.path={folder}", "dataset.keep_fields=[source_url]")
    assert again.manifest.dataset["digest"] == result.manifest.dataset["digest"]
    other = tmp_path / "ds2"
    datasets.Dataset.from_dict(dict(ROWS, prompt=["x", "y", "z"])).save_to_disk(str(other))
    changed, _, _ = plan(tmp_path, f"dataset.path={other}", "dataset.keep_fields=[source_url]")
    assert changed.manifest.dataset["digest"] != result.manifest.dataset["digest"]


def test_a_split_of_a_dataset_dict(tmp_path):
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(ROWS),
                          "test": datasets.Dataset.from_dict({"prompt": ["only"]})}).save_to_disk(str(folder))
    result, work, _ = plan(tmp_path, f"dataset.path={folder}", "dataset.format=hf", "dataset.split=test")
    assert [r["prompt"] for r in unit_rows(work, result)] == ["only"]
    with pytest.raises(DatasetError, match="dataset.split='validation' is not a split.*its splits: train, test"):
        plan(tmp_path, f"dataset.path={folder}", "dataset.format=hf", "dataset.split=validation")


def test_a_hub_dataset_id_from_the_local_cache(tmp_path, monkeypatch):
    commit = "fedcba9876543210fedcba9876543210fedcba98"
    repo = tmp_path / "hub" / "datasets--bcgen-test--prompts"
    (repo / "snapshots" / commit / "data").mkdir(parents=True)
    pq.write_table(pa.table({"prompt": ["a red star", "a blue square"]}),
                   repo / "snapshots" / commit / "data" / "train-00000-of-00001.parquet")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))
    result, work, _ = plan(tmp_path, "dataset.path=bcgen-test/prompts", "dataset.format=hf")
    assert sorted(r["prompt"] for r in unit_rows(work, result)) == ["a blue square", "a red star"]
    with pytest.raises(UserError, match=r"dataset.path='bcgen-test/missing'.*hf download bcgen-test/missing "
                                        r"--repo-type dataset"):
        plan(tmp_path, "dataset.path=bcgen-test/missing", "dataset.format=hf")
