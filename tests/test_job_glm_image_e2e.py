"""End to end, GLM-Image: the CLI with `glm_image_tiny` writes image shards that webdataset and wids
read back; each json records the prior's token digest and grid (equal rows, equal prior; another
seed, another prior), prompts with quoted text get their own glyph-length bucket; `jobs.verify`
passes and a rerun resumes with the shards' bytes unchanged.
"""

from __future__ import annotations

import io
import json
import re

import pytest

from tests.helpers import compose_cfg, write_jsonl
from tests.test_job_e2e import run_cli, sha

ROWS = [
    {"key": "fox", "prompt": "a red fox in the snow", "seed": 11},
    {"key": "fox-again", "prompt": "a red fox in the snow", "seed": 11},  # the same row: the same prior
    {"key": "fox-other-seed", "prompt": "a red fox in the snow", "seed": 12},
    {"key": "sign", "prompt": "a shop sign that says 'OPEN'", "width": 96},  # glyph length 5
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("glm")
    data = write_jsonl(tmp / "prompts.jsonl", ROWS)
    args = ["model=glm_image_tiny", f"dataset.path={data}", f"output_dir={tmp / 'out'}", "sampling.steps=2",
            "job.progress=false", "sink.maxcount=3"]
    run_cli(*args)
    return tmp / "out", args


def test_images_and_the_priors_digest(job):
    import webdataset as wds
    from PIL import Image

    out, _ = job
    seen = {}
    for sample in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(sample["json"])
        seen[meta["key"]] = meta
        assert Image.open(io.BytesIO(sample["jpg"])).size == (meta["width"], meta["height"])
    assert sorted(seen) == sorted(r["key"] for r in ROWS)
    for meta in seen.values():
        assert re.fullmatch(r"[0-9a-f]{64}", meta["prior_tokens_sha256"])
        assert meta["prior_grid"] == [meta["height"] // 32, meta["width"] // 32]
    assert seen["fox"]["prior_tokens_sha256"] == seen["fox-again"]["prior_tokens_sha256"]
    assert seen["fox"]["prior_tokens_sha256"] != seen["fox-other-seed"]["prior_tokens_sha256"]
    assert (seen["fox"]["bucket"], seen["sign"]["bucket"]) == (1, 5)


def test_wids_reads_the_index_and_verify_passes(job):
    import wids

    from jobs.output.audit import verify_output

    out, _ = job
    ds = wids.ShardListDataset(str(out / "index.wids.json"), cache_dir=str(out.parent / "wids"), transformations=[])
    assert sorted(json.loads(ds[i][".json"].read())["key"] for i in range(len(ds))) == sorted(r["key"] for r in ROWS)
    report = verify_output(out)
    assert report.problems == [] and report.samples == len(ROWS)


def test_a_rerun_resumes_and_keeps_the_shards_bytes(job):
    from jobs.worker.run import run_job

    out, args = job
    before = {p.name: sha(p) for p in out.glob("shard-*.tar")}
    stats = run_job(compose_cfg(args))
    assert stats.status == "complete" and stats.items_written == 0
    assert {p.name: sha(p) for p in out.glob("shard-*.tar")} == before
