"""Bad input stops the job before any model loads, with the key or file:line, the value and the fix."""

from __future__ import annotations

import json
import os

import pytest

import tempfile
from pathlib import Path

from jobs.dataset import DatasetError
from jobs.errors import UserError
from jobs.plan.build import plan_dataset
from jobs.preflight import check_config
from tests.helpers import compose_cfg, write_jsonl
from tests.test_job_e2e import FAST, run_cli


def plan_of(cfg):
    """Everything the job decides before a model loads: config checks, dataset, plan (its manifest)."""
    divisor = check_config(cfg).divisor
    with tempfile.TemporaryDirectory() as work:
        return plan_dataset(cfg, divisor, Path(work) / "plan").manifest


def test_resolution_not_divisible_names_key_and_fix(tmp_path):
    cfg = compose_cfg(["sampling.height=130", f"output_dir={tmp_path}"])
    with pytest.raises(ValueError) as e:
        check_config(cfg)
    assert "sampling.height=130 is not a multiple of 32" in str(e.value) and "use 128" in str(e.value)


def test_output_dir_not_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = compose_cfg([f"output_dir={blocker}/out"])
    with pytest.raises(UserError, match=f"'{blocker}' is a file; choose another output_dir"):
        check_config(cfg)


def test_row_size_error(tmp_path):
    # patch size 2 x VAE 8 = 16, and SanaPipeline's 32: a row's 72 passes the dataset's multiple-of-8
    # rule but not the model's. (Another architecture than the trained one: random weights.)
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"prompt": "bad size", "width": 72, "height": 64}])
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'o'}", *FAST,
                       "model.tiny.transformer.patch_size=2", "model.tiny.weights=random"])
    with pytest.raises(DatasetError) as e:
        plan_of(cfg)
    assert f"{data}:2:" in str(e.value) and "64x72 is not a multiple of 32" in str(e.value)


def test_long_prompt_refused_by_config(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "word " * 400}])
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'o'}", "model.on_long_prompt=fail", *FAST])
    with pytest.raises(DatasetError) as e:
        plan_of(cfg)
    assert f"{data}:1:" in str(e.value) and "more than the model's 300" in str(e.value)


def test_long_prompt_truncated_and_counted(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "word " * 400}, {"prompt": "short"}, {"prompt": ""}])
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'o'}", *FAST])
    plan = plan_of(cfg)
    assert plan.truncated == 1 and plan.n_items == 3  # the empty prompt is valid (unconditional)


def test_bad_rows_fail_the_cli_and_write_nothing(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "good"}\n{"prompt": 3}\n{not json\n{"prompt": "x", "steps": 0}\n')
    out = tmp_path / "out"
    proc = run_cli(f"dataset.path={data}", f"output_dir={out}", *FAST, check=False)
    assert proc.returncode == 2
    err = proc.stdout + proc.stderr
    assert f"{data}:2:" in err and f"{data}:3:" in err and f"{data}:4:" in err
    assert "dataset.on_error=skip" in err
    assert not list(out.glob("shard-*.tar"))


def test_bad_rows_skipped_go_to_ledger_and_summary(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"key": "a/../b.c", "prompt": "good"}\n{"prompt": 3}\n{"key": "z", "prompt": ""}\n')
    out = tmp_path / "out"
    run_cli(f"dataset.path={data}", f"output_dir={out}", "dataset.on_error=skip", *FAST)
    ledger = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(r["line"], r["file"]) for r in ledger] == [(2, str(data))]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bad_rows"] == 1 and summary["items_written"] == 2
    # a resumed run lists each bad row once, not once per run
    run_cli(f"dataset.path={data}", f"output_dir={out}", "dataset.on_error=skip", *FAST)
    assert len((out / "errors.jsonl").read_text().splitlines()) == 1
    # A key with '/', '..' and '.' stays inside the shard, as one sample, and comes back intact.
    import webdataset as wds

    keys = [json.loads(s["json"])["key"] for s in wds.WebDataset([str(p) for p in out.glob("shard-*.tar")],
                                                                   shardshuffle=False)]
    assert sorted(keys) == ["a/../b.c", "z"]
    # nothing was written outside the job's own files (no `a/`, no `b.c`)
    assert all(n.startswith(("_", "shard-", "index.", "summary", "errors.", "logs", "run.")) for n in os.listdir(out))
    assert not (out / "a").exists() and not (tmp_path / "b.c").exists()
