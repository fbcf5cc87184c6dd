"""Many processes, one dataset: torchrun ranks (gloo on CPU) and submitit array tasks x ranks.

Both runs go through the real CLI in subprocesses and are compared with a 1-process run: the same
keys, the same image bytes, each key once, one index and one summary over every part. Ranks and
array tasks are workers leasing the units of one plan, so which part writes which unit may vary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import prompts, write_jsonl
from tests.test_resume_kill import FAST, cli, log_of, shard_bytes

TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "jobs.generate")


def images_by_key(out: Path) -> dict:
    import webdataset as wds

    found = {}
    for sample in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        key = json.loads(sample["json"])["key"]
        assert key not in found, f"{key} is in two shards"
        found[key] = sample["jpg"]
    return found


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    rows = prompts(6)
    rows[4]["width"] = 128  # a second signature: the parts' boundary falls between runs
    return tmp, rows, write_jsonl(tmp / "prompts.jsonl", rows)


@pytest.fixture(scope="module")
def one_rank(dataset):
    tmp, rows, data = dataset
    out = tmp / "one"
    proc = cli(f"dataset.path={data}", f"output_dir={out}", *FAST)
    assert proc.returncode == 0, log_of(proc)
    return out


def test_two_gloo_ranks_write_the_same_images_as_one(dataset, one_rank):
    tmp, rows, data = dataset
    out = tmp / "two"
    proc = cli(f"dataset.path={data}", f"output_dir={out}", *FAST, module=TORCHRUN)
    assert proc.returncode == 0, log_of(proc)
    assert images_by_key(out) == images_by_key(one_rank)  # same keys, same bytes, each once
    names = sorted(shard_bytes(out))
    assert all(n.startswith("shard-u") for n in names)  # shards are named by unit, whoever wrote them
    index = json.loads((out / "index.wids.json").read_text())
    assert sorted(s["url"] for s in index["shardlist"]) == names
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items_written"]) == ("complete", len(rows))
    assert [p["part"] for p in summary["parts"]] == [0, 1]

    # A refused claim on rank 0 reaches every rank: all exit, none waits at a barrier.
    refused = cli(f"dataset.path={data}", f"output_dir={out}", *FAST, "sampling.steps=3", module=TORCHRUN, timeout=120)
    assert refused.returncode != 0 and log_of(refused).count("sampling.steps: 2 -> 3") >= 2, log_of(refused)

    # Resuming with another world size reads the 2-rank shards and finds nothing left to do.
    before = shard_bytes(out)
    again = cli(f"dataset.path={data}", f"output_dir={out}", *FAST)
    assert again.returncode == 0, log_of(again)
    assert "every planned item is already committed" in log_of(again)
    assert shard_bytes(out) == before


def test_submitit_local_partitions_fill_one_output_dir(dataset, one_rank):
    """`-m hydra/launcher=submitit_local job.partition=0/2,1/2`: two array jobs started together
    claim one folder (the default output_dir leaves job.partition out) and split the dataset."""
    tmp, rows, data = dataset
    work = tmp / "submitit"
    work.mkdir()
    proc = cli("-m", "hydra/launcher=submitit_local", "job.partition=0/2,1/2",
               f"dataset.path={data}", *FAST, cwd=work, timeout=400)
    assert proc.returncode == 0, log_of(proc)
    folders = [p.parent for p in (work / "outputs").glob("*/run.json")]
    assert len(folders) == 1 and folders[0].name.startswith("sana_tiny--"), folders  # beside a plain run, not in it
    out = folders[0]
    assert images_by_key(out) == images_by_key(one_rank)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items_written"]) == ("complete", len(rows))
    assert sorted(p["part"] for p in summary["parts"]) == [0, 1]
    index = json.loads((out / "index.wids.json").read_text())
    assert sum(s["nsamples"] for s in index["shardlist"]) == len(rows)
