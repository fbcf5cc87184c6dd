"""The planner's output is frozen: the same dataset and config give the same plan as the planner
of issue 11's first version (row-by-row Python), whatever is made faster inside it.

tests/data/plan_golden.json holds, for a few datasets with the tricky cases (duplicate keys across
chunks, non-ASCII and control-free exotic prompts, numbers, per-row width/height/seed/negative/
guidance/steps/fps/num_frames, derived keys, bad rows, sizes the model refuses, long prompts,
`dataset.limit`), plan.json (less the file's path and mtime), the row errors and every unit's
content digest (schema + columns). The unit files' bytes are compared too where the pyarrow
version is the one that wrote the fixture (parquet's footer names the writer's version).

Regenerate (only for an intended change of the plan's format):
    BCGEN_REGEN_PLAN_GOLDEN=1 pytest tests/test_plan_golden.py
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from jobs.dataset import DatasetError
from jobs.models.registry import get_family
from jobs.plan.build import plan_dataset
from jobs.output.layout import unit_name
from tests.helpers import compose_cfg

GOLDEN = Path(__file__).parent / "data" / "plan_golden.json"

_WORDS = ("red fox quiet lake misty mountain morning light over an old stone bridge, (octane_render) 4K! "
          "don't UPPER a.b;c -- ~`^| x12ab34 supercalifragilisticexpialidocious").split()
_EXOTIC = ["café", "naïve", "東京", "emoji😀", "Straße", "İstanbul", "ﬁne", "x" * 120]


def _prompt(rng: random.Random, i: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 40))]
    if i % 9 == 0:
        words.insert(rng.randint(0, len(words)), rng.choice(_EXOTIC))
    if i % 13 == 0:
        words += ["long"] * rng.choice((70, 140, 320))  # buckets 128, 256 and past the 300-token limit
    words.append(str(rng.randint(0, 10**rng.randint(1, 12))))  # numbers: new words for the word table
    text = " ".join(words)
    return ("  " + text.upper() + " ") if i % 17 == 0 else text


def _rows(n: int, seed: int) -> list:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        r = {"key": f"k{i:04d}" if i % 23 else f"ключ-{i}", "prompt": _prompt(rng, i)}
        if i % 5 == 0:
            r["width"] = rng.choice((96, 128, 192))
        if i % 6 == 0:
            r["height"] = rng.choice((64, 128))
        if i % 4 == 0:
            r["seed"] = rng.randrange(0, 2**63)
        if i % 7 == 0:
            r["negative_prompt"] = rng.choice(("blurry, (low quality)", "", "Zerstört, café"))
        if i % 8 == 0:
            r["guidance_scale"] = rng.choice((1, 1.0, 0.5, 7.5, 3))
        if i % 10 == 0:
            r["steps"] = rng.choice((2, 3))
        if i % 12 == 0:
            r["fps"] = rng.choice((8, 24.0))
        if i % 15 == 0:
            r["num_frames"] = 1
        if i % 19 == 0:
            del r["key"]  # derived from the file's stem and line
        rows.append(r)
    for dup, first in ((50, 3), (170, 120), (171, 3), (299, 298)):
        if "key" in rows[first]:
            rows[dup]["key"] = rows[first]["key"]
    return rows


def _clean(tmp: Path) -> Path:
    """Valid JSONL throughout: the Arrow fast lane takes it (duplicates are found across chunks)."""
    path = tmp / "clean.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(_rows(300, 1))))
    return path


def _dirty(tmp: Path) -> Path:
    """Bad rows too, so the row-by-row readers take it; and sizes and frame counts the model refuses."""
    rows = _rows(300, 2)
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    lines[7] = "{not json"
    lines[11] = json.dumps({"prompt": "x", "width": 100})  # not a multiple of 8: the validator
    lines[12] = json.dumps({"prompt": "a size the VAE refuses", "width": 72, "key": "w72"})
    lines[13] = json.dumps({"prompt": "frames", "num_frames": 5, "key": "f5"})
    lines[14] = json.dumps({"prompt": "", "key": "empty"})
    lines[15] = ""
    lines[16] = json.dumps({"prompt": "tab\tand\u000bvt \u0001 control", "key": "ctl"})
    path = tmp / "dirty.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


CASES = {
    "clean_1proc_small_chunks": (_clean, ["plan.workers=1", "plan.chunk_mb=0.004", "plan.unit_items=17",
                                                   "dataset.on_error=skip"]),
    "clean_guidance_int_seed_neg": (_clean, ["plan.workers=1", "plan.unit_items=40", "sampling.guidance_scale=4",
                                             "sampling.seed=12345", "sampling.negative_prompt='ugly, blurry'",
                                             "dataset.on_error=skip"]),
    "clean_limit": (_clean, ["plan.workers=1", "plan.unit_items=25", "dataset.limit=150", "dataset.on_error=skip"]),
    "dirty_skip": (_dirty, ["plan.workers=1", "plan.unit_items=30", "dataset.on_error=skip", "sampling.steps=3"]),
    "dirty_fail_long": (_dirty, ["plan.workers=1", "dataset.on_error=skip", "model.on_long_prompt=fail",
                                 "sampling.guidance_scale=1"]),
    "clean_fail": (_clean, ["plan.workers=1"]),  # duplicates with on_error=fail: the error text
}


def _digest_table(path: Path) -> str:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    body = json.dumps({"schema": str(table.schema), "columns": table.to_pydict()}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def snapshot(tmp: Path, name: str) -> dict:
    import pyarrow as pa

    make, overrides = CASES[name]
    data = make(tmp)
    work = tmp / f"w_{name}"
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp / ('out_' + name)}", "sampling.height=64",
                       "sampling.width=64", "sampling.steps=2", *overrides])
    divisor = get_family(cfg.model.family).spatial_divisor(cfg.model)
    try:
        res = plan_dataset(cfg, divisor, work)
    except DatasetError as e:
        return {"raised": str(e).replace(str(data), "DATA")}
    plan = res.manifest.to_json()
    plan["dataset"] = {k: v for k, v in plan["dataset"].items() if k not in ("path", "mtime_ns")}
    units = [{"id": u.id, "digest": _digest_table(work / f"{unit_name(u.id)}.parquet"),
              "file_sha256": hashlib.sha256((work / f"{unit_name(u.id)}.parquet").read_bytes()).hexdigest()}
             for u in res.manifest.units]
    errors = [[e.line, e.key, str(e).replace(str(data), "DATA")] for e in res.errors]
    return {"plan": plan, "errors": errors, "units": units, "pyarrow": pa.__version__}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_equals_the_frozen_plan(tmp_path, name):
    got = snapshot(tmp_path, name)
    if os.environ.get("BCGEN_REGEN_PLAN_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[name] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        return
    want = json.loads(GOLDEN.read_text())[name]
    if "raised" in want:
        assert got == want
        return
    assert got["plan"] == want["plan"]
    assert got["errors"] == want["errors"]
    assert [(u["id"], u["digest"]) for u in got["units"]] == [(u["id"], u["digest"]) for u in want["units"]]
    if got["pyarrow"] == want["pyarrow"]:  # the same writer: the same bytes
        assert [u["file_sha256"] for u in got["units"]] == [u["file_sha256"] for u in want["units"]]
