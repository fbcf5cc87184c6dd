"""One small job the way a new user meets it: stopped with Ctrl-C, resumed, rerun with nothing to do.

The real CLI in subprocesses on the tiny SANA preset at 64x64 and 2 steps; the shards read back
with webdataset and the parquet with pyarrow. What it proves: the closing counts (N of the plan's
items after a stop, a sane line when nothing is left), several samples a row with their own keys
and seeds, kept dataset fields in the json and the parquet, provenance in run.json and
summary.json, and that provenance does not make a resume look like another run.
"""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from tests.helpers import write_jsonl
from tests.test_resume_kill import cli, shard_keys

pytestmark = pytest.mark.slow

FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false", "bcg.batch_sizes=[1]",
        "plan.unit_items=2"]


def log_of(proc) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("first_hour")
    rows = [{"key": f"r{i}", "prompt": f"a red star {i}", "url": f"http://example.com/{i}", "score": i / 2}
            for i in range(4)]
    rows[1]["guidance"] = 3.0  # a typo'd field: warned about, with the nearest known one
    data = write_jsonl(tmp / "rows.jsonl", rows)
    out = tmp / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", "sampling.images_per_prompt=2",
            "dataset.keep_fields=[url,score]", *FAST]
    cache = {"BCGEN_RATE_CACHE": str(tmp / "rates.json")}  # what a finished job measured, for --estimate
    stopped = cli(*args, env={"BCGEN_TEST_KILL_AT": "batch:3", "BCGEN_TEST_KILL_SIGNAL": "INT", **cache})
    resumed = cli(*args, env=cache)
    again = cli(*args, env=cache)
    return out, stopped, resumed, again, args, cache


def test_ctrl_c_counts_the_plans_items(job):
    _, stopped, *_ = job
    assert stopped.returncode == 130, log_of(stopped)
    m = re.search(r"bcgen interrupted: (\d+) images written of (\d+) planned", log_of(stopped))
    assert m and m.group(2) == "8", log_of(stopped)  # 4 units of 2: not only the units leased so far
    assert "'guidance' (did you mean 'guidance_scale'?)" in log_of(stopped)


def test_resume_writes_n_samples_a_row_with_their_keys_and_kept_fields(job):
    out, _, resumed, *_ = job
    assert resumed.returncode == 0, log_of(resumed)
    assert shard_keys(out) == {f"r{i}-{s}": 1 for i in range(4) for s in range(2)}
    table = pq.read_table(sorted(out.glob("shard-*.parquet"))).to_pylist()
    by_key = {r["key"]: r for r in table}
    assert by_key["r3-1"]["url"] == "http://example.com/3" and by_key["r3-1"]["score"] == "1.5"
    assert by_key["r0-0"]["seed"] != by_key["r0-1"]["seed"]
    import webdataset as wds

    metas = [json.loads(s["json"]) for s in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))],
                                                           shardshuffle=False)]
    r2 = next(m for m in metas if m["key"] == "r2-0")
    assert r2["url"] == "http://example.com/2" and r2["score"] == 1.0 and "guidance" not in r2


def test_nothing_to_do_rerun_says_so(job):
    _, _, _, again, *_ = job
    text = log_of(again)
    assert again.returncode == 0, text
    assert "nothing generated in this run" in text and " on ;" not in text and "0.00" not in text
    assert re.search(r"bcgen complete: 0 \w+ written of 8 planned \(8 already done\)", text), text


def test_provenance_in_run_json_and_summary_without_changing_the_identity(job):
    import torch

    out, _, resumed, again, *_ = job
    run = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    for prov in (run["provenance"], summary["provenance"]):
        assert prov["torch"] == torch.__version__ and prov["diffusers"] and prov["transformers"]
        assert prov["bcgen"] and prov["quality_tier"] == "lossless" and prov["device"] == "cpu"
        assert prov["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", prov["git_commit"])
    s = summary["provenance"]
    assert s["started"] <= s["ended"] and s["run_claimed"] == run["provenance"]["time"] <= s["started"]
    assert "holds a run with a different" not in log_of(resumed) + log_of(again)  # provenance is not identity


def test_estimate_uses_the_rate_measured_here_then_the_cached_one(job, tmp_path):
    from jobs.plan import Signature
    from jobs.plan.estimate import format_cost, format_duration
    from jobs.plan.units import item_cost

    out, _, _, _, args, cache = job
    here = cli(*args, "--estimate", module=("-m", "jobs.plan"), env=cache)
    assert here.returncode == 0, log_of(here)
    assert "estimate: 0 of 8 planned items left" in log_of(here) and re.search(r"measured on \d+ items", log_of(here))
    # A new output_dir: no timeline there, so the rate the finished job cached for this model, device and tier.
    with open(cache["BCGEN_RATE_CACHE"]) as f:
        rates = json.load(f)
    (key, rate), = rates.items()
    assert re.fullmatch(r"sana_tiny#[0-9a-f]{12}\|cpu\|lossless", key) and rate["items"] >= 1 and rate["cost_per_s"] > 0
    # the resumed run's wait for its first batch, as its summary said (the rerun after it had no batch)
    assert rate["first_batch_s"] > 0 and "before its first batch" not in log_of(here)  # nothing left to wait for
    fresh = [a if not a.startswith("output_dir=") else f"output_dir={tmp_path / 'new'}" for a in args]
    new = cli(*fresh, "--estimate", module=("-m", "jobs.plan"), env=cache)
    plan = json.loads((tmp_path / "new" / "_plan" / "plan.json").read_text())
    cost = sum(item_cost(Signature(**u["signature"])) * u["count"] for u in plan["units"])
    assert f"estimate: 8 of 8 planned items left, {format_cost(cost)} megapixel-steps" in log_of(new)
    assert f"{format_duration(cost / rate['cost_per_s'])} on one worker" in log_of(new)
    assert f"cached: {rate['items']} items on cpu" in log_of(new)
    assert f"plus {rate['first_batch_s']:.1f}s a worker before its first batch" in log_of(new)
    none = cli(*[a.replace("new", "none") for a in fresh], "--estimate", module=("-m", "jobs.plan"),
               env={"BCGEN_RATE_CACHE": str(tmp_path / "empty.json")})
    assert "no measured rate for this model and quality tier here: time unknown" in log_of(none), log_of(none)
    # The same preset with another transformer (as model=sana at 600M and 1.6B): another speed, not this rate.
    deeper = cli(*[a.replace("new", "deeper") for a in fresh], "model.tiny.transformer.num_layers=6",
                 "model.tiny.weights=random", "--estimate", module=("-m", "jobs.plan"), env=cache)
    assert "no measured rate for this model and quality tier here: time unknown" in log_of(deeper), log_of(deeper)
