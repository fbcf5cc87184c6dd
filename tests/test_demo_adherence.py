"""The default model draws what it is asked, in the pipeline and through the whole job.

Eight bundled prompts (held-out phrasings: the model never saw them verbatim), generated at the
default job's settings (128 px, 8 steps, guidance 4.5) and read back by the fixed pixel rule. The
thresholds sit well above chance (1/8 for a colour, 1/4 for a shape): a padder that hands the
model another prompt's text, a resume that files an image under another key, or weights that
failed to load fail here. The scores against shuffled labels show the check can fail.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from jobs.demo import prompt_set
from jobs.demo.adherence import generate_eager, score
from tests.helpers import compose_cfg, tiny_pipeline, write_jsonl
from tests.test_job_e2e import run_cli

N = 8


def job_images(out: Path) -> dict:
    import webdataset as wds
    from PIL import Image

    got = {}
    for s in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(s["json"])
        got[meta["key"]] = (np.asarray(Image.open(io.BytesIO(s["png"])).convert("RGB")), meta)
    return got


@pytest.fixture(scope="module")
def rows():
    # one of each shape twice, from the short and caption rows (held-out templates)
    picked, per_shape = [], {}
    for r in prompt_set.build_rows():
        shape = r["labels"].shape
        if r["heldout"] and "negative_prompt" not in r and r["key"].startswith(("short", "caption")) \
                and per_shape.get(shape, 0) < N // 4:
            per_shape[shape] = per_shape.get(shape, 0) + 1
            picked.append(r)
    assert len(picked) == N
    return picked


def check(result, n=N):
    acc = result["accuracy"]
    assert acc["color"] >= 7 / n and acc["background"] >= 7 / n and acc["shape"] >= 5 / n, result


@pytest.fixture(scope="module")
def eager(rows):
    cfg, _, pipe = tiny_pipeline("sana_tiny")
    s = cfg.sampling
    return generate_eager(pipe, [r["prompt"] for r in rows], [1000 + i for i in range(N)], steps=s.steps,
                          guidance_scale=s.guidance_scale, height=s.height, width=s.width, batch=N)


def test_pipeline_draws_the_prompt(rows, eager):
    check(score(eager, [r["labels"] for r in rows]))


def test_shuffled_labels_fail(rows, eager):
    # the same images against every other row's labels: the check is not satisfied by any picture
    shifted = [rows[(i + 1) % N]["labels"] for i in range(N)]
    result = score(eager, shifted)
    assert result["accuracy"]["color"] <= 2 / N and result["accuracy"]["background"] <= 2 / N, result


def test_default_job_draws_the_prompt_with_and_without_padding(rows, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"key": r["key"], "prompt": r["prompt"]} for r in rows])
    common = [f"dataset.path={data}", "sink=png", "job.progress=false"]
    run_cli(*common, f"output_dir={tmp_path / 'job'}")
    run_cli(*common, f"output_dir={tmp_path / 'native'}", "bcg.text_buckets=[300]")  # no re-cut: all at 300
    job, native = job_images(tmp_path / "job"), job_images(tmp_path / "native")
    keys = [r["key"] for r in rows]
    result = score([job[k][0] for k in keys], [r["labels"] for r in rows])
    check(result)
    assert score([native[k][0] for k in keys], [r["labels"] for r in rows])["readings"] == result["readings"]
    meta = {k: job[k][1] for k in keys}
    assert {m["prompt"] for m in meta.values()} == {r["prompt"] for r in rows}
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["items_written"] == N
    # the config the job ran is the default one: trained weights, 128 px, 8 steps, guidance 4.5
    cfg = compose_cfg(["output_dir=/tmp/x"])
    assert cfg.model.tiny["weights"] == "trained" and cfg.sampling.steps == 8 and cfg.sampling.height == 128
    assert all(np.asarray(job[k][0]).shape == (128, 128, 3) for k in keys)
