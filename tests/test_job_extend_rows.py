"""`job.extend=true` refuses a planned row whose kept fields (dataset.keep_fields) or video fps changed.

Real plans, written by the real planner in-process (`python -m jobs.plan`'s plan_typed, no model loaded)
into a real output_dir, then extended from an edited dataset file: the done shards hold the planned
values, so an extended run must not mix them with other sidecar columns or another frame rate.
"""

from __future__ import annotations

import json

import pytest

from jobs.errors import UserError
from jobs.plan.__main__ import plan_typed
from tests.helpers import compose_cfg, write_jsonl


def _plan(data, out, *overrides, extend=False):
    args = [f"dataset.path={data}", f"output_dir={out}", "plan.unit_items=2", "sampling.height=64",
            "sampling.width=64", *overrides]
    plan_typed(compose_cfg([*args, *(["job.extend=true"] if extend else [])]))


def _plan_files(out) -> dict:
    return {p.name: p.read_bytes() for p in (out / "_plan").iterdir() if p.is_file()}


def test_extend_refuses_a_row_whose_kept_field_changed(tmp_path):
    data, out = tmp_path / "rows.jsonl", tmp_path / "out"
    rows = [{"key": "a", "prompt": "red fox", "url": "u1"}, {"key": "b", "prompt": "blue lake", "url": "u2"}]
    write_jsonl(data, rows)
    _plan(data, out, "dataset.keep_fields=[url]")
    before = _plan_files(out)
    edited = [rows[0], dict(rows[1], url="moved"), {"key": "c", "prompt": "green hill", "url": "u3"}]
    write_jsonl(data, edited)
    with pytest.raises(UserError, match=rf"key 'b' at {data}:2 was planned with other values \(kept fields "
                                        r"\(dataset.keep_fields\) '\{\"url\": \"u2\"\}' -> '\{\"url\": \"moved\"\}'\).*"
                                        r"another output_dir \(job.overwrite=true starts over\)"):
        _plan(data, out, "dataset.keep_fields=[url]", extend=True)
    assert _plan_files(out) == before  # the run's plan is untouched
    # A kept field the planned row had, dropped: its json would lose it.
    write_jsonl(data, [{"key": "a", "prompt": "red fox"}, rows[1]])
    dropped = r"key 'a' .*\(kept fields \(dataset.keep_fields\) '\{\"url\": \"u1\"\}' -> None\)"
    with pytest.raises(UserError, match=dropped):
        _plan(data, out, "dataset.keep_fields=[url]", extend=True)


def test_extend_with_the_same_kept_fields_adds_the_new_rows(tmp_path):
    data, out = tmp_path / "rows.jsonl", tmp_path / "out"
    rows = [{"key": "a", "prompt": "red fox", "url": "u1"}, {"key": "b", "prompt": "blue lake", "url": "u2"},
            {"key": "c", "prompt": "green hill", "url": "u3"}]
    write_jsonl(data, rows[:2])
    _plan(data, out, "dataset.keep_fields=[url]")
    write_jsonl(data, rows)
    _plan(data, out, "dataset.keep_fields=[url]", extend=True)
    assert json.loads((out / "_plan" / "plan.json").read_text())["items"] == 3


def test_extend_refuses_a_video_row_whose_fps_changed(tmp_path):
    data, out = tmp_path / "clips.jsonl", tmp_path / "out"
    video = ("model=sana_video_tiny", "sampling.steps=2")
    rows = [{"key": "a", "prompt": "red fox", "fps": 16}, {"key": "b", "prompt": "blue lake"}]
    write_jsonl(data, rows)
    _plan(data, out, *video)
    before = _plan_files(out)
    write_jsonl(data, [dict(rows[0], fps=24), rows[1], {"key": "c", "prompt": "green hill"}])
    with pytest.raises(UserError, match=rf"key 'a' at {data}:1 was planned with other values \(fps 16.0 -> 24.0\)"):
        _plan(data, out, *video, extend=True)
    assert _plan_files(out) == before
    # The same rows, and a new one: extended (an unchanged fps is no change).
    write_jsonl(data, [*rows, {"key": "c", "prompt": "green hill", "fps": 24}])
    _plan(data, out, *video, extend=True)
    assert json.loads((out / "_plan" / "plan.json").read_text())["items"] == 3
