"""Frames and fps: rows and config carry them, validated like every other field; the plan puts
frames into the graph signature and fps into the item; image families refuse more than one frame.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from jobs.dataset import DatasetConfig, DatasetError, load_dataset
from jobs.errors import UserError
from jobs.models.registry import get_family
from jobs.plan import Signature
from jobs.plan.build import plan_dataset
from jobs.plan.units import read_unit
from jobs.output.layout import unit_name
from jobs.preflight import check_config
from tests.helpers import compose_cfg, prompts, write_jsonl

BAD = [
    ('{"prompt": "x", "num_frames": 0}', "num_frames must be an integer in [1, 1024], got 0"),
    ('{"prompt": "x", "num_frames": 1025}', "num_frames must be an integer in [1, 1024], got 1025"),
    ('{"prompt": "x", "num_frames": 8.0}', "num_frames must be an integer in [1, 1024], got float 8.0"),
    ('{"prompt": "x", "num_frames": true}', "num_frames must be an integer in [1, 1024], got bool True"),
    ('{"prompt": "x", "num_frames": "81"}', "num_frames must be an integer in [1, 1024], got str '81'"),
    ('{"prompt": "x", "fps": 0}', "fps must be a number in (0, 240], e.g. 16 or 24, got 0"),
    ('{"prompt": "x", "fps": -24}', "fps must be a number in (0, 240], e.g. 16 or 24, got -24"),
    ('{"prompt": "x", "fps": 241}', "fps must be a number in (0, 240], e.g. 16 or 24, got 241"),
    ('{"prompt": "x", "fps": NaN}', "fps must be a number in (0, 240], e.g. 16 or 24, got nan"),
    ('{"prompt": "x", "fps": "24"}', "fps must be a number in (0, 240], e.g. 16 or 24, got str '24'"),
]


def test_bad_num_frames_and_fps_rows_name_file_line_and_rule(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line, _ in BAD) + '{"prompt": "x", "num_frames": 81, "fps": 23.976}\n')
    result = load_dataset(DatasetConfig(path=str(path), on_error="skip"))
    assert [str(e) for e in result.errors] == [f"{path}:{n}: {reason}" for n, (_, reason) in enumerate(BAD, 1)]
    (good,) = result.records
    assert (good.num_frames, good.fps) == (81, 23.976)


def test_csv_cells_are_parsed_like_json(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,num_frames,fps\na,17,24\nb,x,12.5\n")
    result = load_dataset(DatasetConfig(path=str(path), on_error="skip"))
    assert [(r.num_frames, r.fps) for r in result.records] == [(17, 24.0)]
    assert [e.reason for e in result.errors] == ["num_frames must be an integer in [1, 1024], got str 'x'"]


@pytest.mark.parametrize("override, message", [
    ("sampling.num_frames=0", "sampling.num_frames=0 is invalid: expected an int in [1, 1024]"),
    ("sampling.fps=0", "sampling.fps=0.0 is invalid: expected a number in (0, 240]"),
])
def test_config_limits(override, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        compose_cfg([override, "output_dir=/tmp/x"])


def test_an_image_family_refuses_frames_in_config_and_in_rows(tmp_path):
    cfg = compose_cfg(["sampling.num_frames=9", f"output_dir={tmp_path / 'o'}"])
    with pytest.raises(UserError, match=r"sampling.num_frames=9, but SanaPipeline makes images .*model=wan"):
        check_config(cfg)
    rows = prompts(3)
    rows[1]["num_frames"] = 5
    rows[2]["num_frames"] = 1  # one frame is an image: fine
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'o'}", "sampling.height=64",
                       "sampling.width=64"])
    with pytest.raises(DatasetError, match=r"p.jsonl:2: num_frames=5, but SanaPipeline makes images"):
        plan_dataset(cfg, get_family("sana").spatial_divisor(cfg.model), tmp_path / "w")


def test_signature_string_of_an_image_is_unchanged_and_a_video_shows_its_frames():
    image = Signature(64, 64, 64, 2, 4.5, True, "float32")
    assert str(image) == "64x64/t64/s2/cfg4.5/float32" and image.frames == 1
    assert str(Signature(64, 64, 64, 2, 4.5, True, "float32", frames=9)) == "64x64/f9/t64/s2/cfg4.5/float32"


def test_plan_carries_frames_in_the_signature_and_fps_per_item(tmp_path, monkeypatch):
    """With a family that makes videos (any count here), rows of other frame counts get other
    signatures and units; fps rides along per item. The fast lane and the row path agree."""
    fam = get_family("sana")
    monkeypatch.setattr(type(fam), "frames_error", lambda self, cfg, n: None)
    rows = prompts(12)
    for i, r in enumerate(rows):
        if i % 3 == 1:
            r["num_frames"] = 9
        if i % 4 == 0:
            r["fps"] = 24 if i % 8 else 12.5
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'o'}", "sampling.height=64",
                       "sampling.width=64", "sampling.steps=2", "sampling.num_frames=5", "sampling.fps=16",
                       "plan.workers=1"])
    import jobs.plan.fast_jsonl as lane

    answers = []
    real = lane.arrow_rows
    monkeypatch.setattr(lane, "arrow_rows", lambda *a: answers.append(real(*a)) or answers[-1])
    fast = plan_dataset(cfg, fam.spatial_divisor(cfg.model), tmp_path / "fast")
    assert answers and all(a is not None for a in answers)  # the fast lane took these rows
    frames = {u.signature.frames: u for u in fast.manifest.units}
    assert sorted(frames) == [5, 9]
    items = {it.key: it for u in fast.manifest.units for it in read_unit(tmp_path / "fast", u, "p", "float32")}
    for i, r in enumerate(rows):
        it = items[r["key"]]
        assert it.signature.frames == r.get("num_frames", 5)
        assert it.fps == float(r.get("fps", 16))
    assert frames[9].cost == pytest.approx(frames[9].count * 64 * 64 * 9 * 2 * 2 / 1e6)
    assert "frames" in pq.read_table(tmp_path / "fast" / f"{unit_name(0)}.parquet").column_names

    monkeypatch.setattr(lane, "arrow_rows", lambda *a: None)  # the row-by-row path
    slow = plan_dataset(cfg, fam.spatial_divisor(cfg.model), tmp_path / "slow")
    assert fast.manifest.to_json() == slow.manifest.to_json()
    for u in fast.manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert pq.read_table(tmp_path / "fast" / name).equals(pq.read_table(tmp_path / "slow" / name))
    assert {u["signature"]["frames"] for u in json.loads(json.dumps(fast.manifest.to_json()))["units"]} == {5, 9}


@pytest.mark.parametrize("line", ['{"prompt": "x", "num_frames": 0}', '{"prompt": "x", "num_frames": 2.0}',
                                  '{"prompt": "x", "fps": 0}', '{"prompt": "x", "fps": 241}',
                                  '{"prompt": "x", "fps": "24"}'])
def test_fast_lane_declines_bad_frames_and_fps(line):
    from jobs.plan.fast_jsonl import arrow_rows

    good = '{"key": "a", "prompt": "fine", "num_frames": 81, "fps": 23.976}'
    assert arrow_rows(f"{good}\n".encode(), 1, "p", "prompt", "key", 1000) is not None
    assert arrow_rows(f"{good}\n{line}\n".encode(), 1, "p", "prompt", "key", 1000) is None
