"""Property: random damage to a finished output, then ONE plain rerun, leaves an output that
`jobs.verify` calls clean, with every key of the dataset exactly once in the indexed shards.

Damage (tests/trust_damage.py): truncate, delete or flip a bit of one of the run's files (a tar, a
parquet, a stats file, a manifest, a done marker, the index, run.json), copy a shard to a free
name of its unit (with or without its manifest), or drop another run's shard there (with or
without its manifest). One tiny finished output is made once and copied per trial (mtimes kept,
as `cp -p` or rsync -t would); the rerun is the job itself, in this process.

The default suite runs a seeded subset; BCGEN_TRUST_TRIALS=200 runs the issue's 200 (README).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from jobs.output.audit import verify_output
from tests.helpers import prompts, write_jsonl
from tests.trust_damage import LocalFiles, apply

TRIALS = int(os.environ.get("BCGEN_TRUST_TRIALS", "10"))
FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false", "bcg.batch_sizes=[2]",
        "sink.maxcount=2", "plan.unit_items=4", "device=cpu"]


def run_job(args) -> int:
    """The job as `python -m jobs.generate ARGS` runs it, in this process: its front door (one
    message and exit 2 or 75 for a user or environment error), its exit code."""
    from hydra import compose, initialize_config_dir

    from jobs.config import register_configs
    from jobs.generate import run_from_dict
    from tests.helpers import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        raw = compose("generate", overrides=list(args))
    return run_from_dict(raw)


def indexed_keys(out: Path) -> Counter:
    """Every key of the shards the index lists, read back with webdataset."""
    import webdataset as wds

    urls = [str(out / s["url"]) for s in json.loads((out / "index.wids.json").read_text())["shardlist"]]
    return Counter(json.loads(s["json"])["key"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("trust")
    rows = prompts(8)
    data = write_jsonl(tmp / "prompts.jsonl", rows)
    out = tmp / "template"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST]
    assert run_job(args) == 0
    other = tmp / "other"
    odata = write_jsonl(tmp / "other.jsonl", [{"key": f"x{i}", "prompt": f"another {i}"} for i in range(2)])
    assert run_job([f"dataset.path={odata}", f"output_dir={other}", *FAST]) == 0
    first = sorted(other.glob("shard-*.tar"))[0]
    foreign = {"tar": first.read_bytes(), "manifest": (other / "_manifest" / f"{first.name}.json").read_bytes()}
    assert verify_output(out).problems == []
    return {"rows": rows, "data": data, "out": out, "foreign": foreign, "tmp": tmp}


@pytest.mark.parametrize("seed", range(TRIALS))
def test_one_plain_rerun_repairs_random_damage(finished, tmp_path, seed):
    out = tmp_path / "out"
    shutil.copytree(finished["out"], out)  # copy2: mtimes kept, as a restore with -p keeps them
    what = apply(LocalFiles(out), seed, finished["foreign"])
    code = run_job([f"dataset.path={finished['data']}", f"output_dir={out}", *FAST])
    assert code == 0, what
    report = verify_output(out)
    assert report.problems == [], f"{what}: {report.problems}"
    assert indexed_keys(out) == Counter(r["key"] for r in finished["rows"]), what


# -- the same on an object store: moto's S3 server on the loopback, s3fs as the client -----------------------------

S3_TRIALS = int(os.environ.get("BCGEN_TRUST_S3_TRIALS", "4"))


class S3Files:
    """A bucket prefix through the interface tests/trust_damage.py damages."""

    def __init__(self, fs, root: str):
        self.fs, self.root = fs, root

    def names(self):
        self.fs.invalidate_cache()
        return sorted(p[len(self.root) + 1:] for p in self.fs.find(self.root))

    def read(self, name):
        return self.fs.cat_file(f"{self.root}/{name}")

    def write(self, name, data):
        self.fs.pipe_file(f"{self.root}/{name}", data)

    def delete(self, name):
        self.fs.rm_file(f"{self.root}/{name}")


@pytest.fixture(scope="module")
def finished_s3(finished, tmp_path_factory):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    import fsspec

    from tests.s3_server import new_bucket, s3_server

    with s3_server():
        bucket = new_bucket()
        tmp = tmp_path_factory.mktemp("trust_s3")
        args = [f"dataset.path={finished['data']}", f"output_dir=s3://{bucket}/template",
                f"job.staging_dir={tmp / 'staging'}", *FAST]
        assert run_job(args) == 0
        yield {**finished, "bucket": bucket, "fs": fsspec.filesystem("s3"), "tmp": tmp}


@pytest.mark.parametrize("seed", range(S3_TRIALS))
def test_one_plain_rerun_repairs_random_damage_on_s3(finished_s3, tmp_path, seed):
    fs, bucket = finished_s3["fs"], finished_s3["bucket"]
    fs.invalidate_cache()
    root = f"{bucket}/t{seed}"
    for path in fs.find(f"{bucket}/template"):
        fs.copy(path, root + path[len(f"{bucket}/template"):])
    what = apply(S3Files(fs, root), seed, finished_s3["foreign"])
    code = run_job([f"dataset.path={finished_s3['data']}", f"output_dir=s3://{root}",
                    f"job.staging_dir={tmp_path / 'staging'}", *FAST])  # another machine: nothing staged
    assert code == 0, what
    local = tmp_path / "copy"
    fs.invalidate_cache()
    fs.get(f"{root}/", str(local), recursive=True)  # jobs.verify reads a local copy (README)
    report = verify_output(local)
    assert report.problems == [], f"{what}: {report.problems}"
    assert indexed_keys(local) == Counter(r["key"] for r in finished_s3["rows"]), what
