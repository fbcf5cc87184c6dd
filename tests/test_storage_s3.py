"""An object-store output_dir against a real S3 server (moto's, started here on the loopback) with
s3fs: shards uploaded whole after their local commit, manifests last, a killed multipart upload
never visible, and a job killed mid-run resumed from the remote state alone."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from sinks import AsyncSink, Sample, SinkConfig  # noqa: E402
from sinks.remote import Remote  # noqa: E402
from sinks.sidecars import MetaSpec  # noqa: E402
from tests.helpers import prompts, write_jsonl  # noqa: E402
from tests.s3_server import new_bucket, s3_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = MetaSpec(columns=(("n", "int64"),))


@pytest.fixture(scope="module")
def s3():
    with s3_server() as env:
        yield env


def fs():
    import fsspec

    f = fsspec.filesystem("s3")
    f.invalidate_cache()
    return f


def write_and_push(staging: Path, remote: Remote, n: int, maxcount: int = 3):
    rng = np.random.default_rng(0)
    pushed = []

    def push(record):
        remote.push_shard(staging, record)
        pushed.append(record)

    with AsyncSink(staging, SinkConfig(format="png", maxcount=maxcount), spec=SPEC, on_commit=push) as sink:
        for i in range(n):
            sink.put(Sample(f"k{i}", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), f"c{i}", {"n": i}))
    return pushed


def test_committed_shard_is_uploaded_whole_then_its_manifest(s3, tmp_path):
    bucket = new_bucket()
    remote = Remote(f"s3://{bucket}/run")
    records = write_and_push(tmp_path, remote, 7)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs().find(f"{bucket}/run"))
    stems = [r.url[:-4] for r in records]
    assert names == sorted([f"{s}{e}" for s in stems for e in (".tar", ".parquet", "_stats.json")]
                           + [f"{r.url}.json" for r in records])
    # The staging folder keeps only the manifests: they hold the names, the payload is remote.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_manifest"]
    for r in records:
        data = fs().cat_file(f"{bucket}/run/{r.url}")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            keys = [json.loads(tar.extractfile(m).read())["key"] for m in tar if m.name.endswith(".json")]
        assert keys == r.keys and len(data) == r.filesize
    import pyarrow.dataset as ds

    table = ds.dataset(sorted(fs().glob(f"{bucket}/run/*.parquet")), filesystem=fs()).to_table()
    assert sorted(table.column("key").to_pylist()) == sorted(f"k{i}" for i in range(7))
    got, quarantined = remote.scan("shard-*.tar", "full", tmp_path)
    assert [g.url for g in got] == [r.url for r in records] and quarantined == []


def test_upload_cut_short_is_not_committed_and_a_changed_object_is_quarantined(s3, tmp_path):
    bucket = new_bucket()
    remote = Remote(f"s3://{bucket}/run")
    records = write_and_push(tmp_path, remote, 9)
    f = fs()
    f.rm(f"{bucket}/run/_manifest/{records[2].url}.json")  # as if killed before the manifest's upload
    f.pipe_file(f"{bucket}/run/{records[1].url}", b"not the shard")  # changed after its commit
    got, quarantined = remote.scan("shard-*.tar", "members", tmp_path)
    assert [g.url for g in got] == [records[0].url]
    assert [q["url"] for q in quarantined] == [records[1].url]
    left = sorted(p.rsplit("/", 1)[-1] for p in fs().find(f"{bucket}/run") if "/_quarantine/" not in p)
    assert not any(n.startswith(records[2].url[:-4]) for n in left)  # the cut-short upload is gone
    assert not any(n.startswith(records[1].url[:-4]) for n in left)  # moved with its sidecars and manifest
    assert sorted(p.name for p in (tmp_path / "_manifest").iterdir()) == [f"{records[0].url}.json"]


def test_the_batch_sizes_go_up_with_the_plan_and_come_back_on_resume(s3, tmp_path):
    """_plan/batching.json decides bytes (jobs/worker/batch_sizer.py): the worker that publishes it uploads
    it; a fresh staging folder gets the remote's; a stale staged one yields to it; one only staged
    (its worker killed before the upload) goes up when the run resumes."""
    from jobs.output.mirror import Mirror
    from jobs.output.storage import Output

    bucket = new_bucket()
    url = f"s3://{bucket}/run"
    remote = Remote(url)
    remote.put_bytes("run.json", b'{"run": 1}')
    remote.put_bytes("_plan/plan.json", b'{"plan": 1}')

    def mirror(staging):
        return Mirror(Output(given=url, local=tmp_path / staging, remote=url), SPEC)

    first = mirror("a")
    first.hydrate(overwrite=False)
    batching = tmp_path / "a" / "_plan" / "batching.json"
    assert not batching.exists()
    batching.write_bytes(b'{"sizes": [1, 2, 4]}')  # as jobs/batch_sizer.publish does
    first.on_plan_file(batching)
    assert remote.read_bytes("_plan/batching.json") == b'{"sizes": [1, 2, 4]}'

    mirror("b").hydrate(overwrite=False)  # another machine: nothing staged
    assert (tmp_path / "b" / "_plan" / "batching.json").read_bytes() == b'{"sizes": [1, 2, 4]}'
    (tmp_path / "b" / "_plan" / "batching.json").write_bytes(b'{"sizes": [8]}')  # staged, not the run's
    mirror("b").hydrate(overwrite=False)
    assert (tmp_path / "b" / "_plan" / "batching.json").read_bytes() == b'{"sizes": [1, 2, 4]}'

    remote.rm(["_plan/batching.json"])  # as if its worker was killed between publishing and uploading
    mirror("a").hydrate(overwrite=False)
    assert remote.read_bytes("_plan/batching.json") == b'{"sizes": [1, 2, 4]}'


KILL_UPLOAD = """
import os, signal, sys
from fsspec.callbacks import Callback
from sinks.remote import Remote

class KillAfterFirstPart(Callback):
    def call(self, *args, **kwargs):
        if self.value > 0:
            print("part", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

Remote(sys.argv[1], chunksize=5 << 20).put(sys.argv[2], "big.tar", callback=KillAfterFirstPart())
"""


def test_killed_multipart_upload_leaves_no_object(s3, tmp_path):
    bucket = new_bucket()
    big = tmp_path / "big.tar"
    big.write_bytes(np.random.default_rng(1).integers(0, 256, 11 << 20, dtype=np.uint8).tobytes())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", KILL_UPLOAD, f"s3://{bucket}/run", str(big)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and "part" in proc.stdout, proc.stderr[-2000:]
    import boto3

    client = boto3.client("s3")
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads")  # begun, never completed ...
    assert not fs().exists(f"{bucket}/run/big.tar")  # ... so no object, not even a partial one
    Remote(f"s3://{bucket}/run", chunksize=5 << 20).put(big, "big.tar")  # a rerun uploads it whole
    assert fs().cat_file(f"{bucket}/run/big.tar") == big.read_bytes()


FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false", "bcg.batch_sizes=[2]",
        "sink.maxcount=3"]


def cli(args, env, staging: Path, kill: str = "") -> subprocess.CompletedProcess:
    full = dict(os.environ, **env, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1",
                BCGEN_STAGING_ROOT=str(staging))
    full.pop("BCGEN_TEST_KILL_AT", None)
    if kill:
        full["BCGEN_TEST_KILL_AT"] = kill
    return subprocess.run([sys.executable, "-m", "jobs.generate", *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=300)


def remote_state(bucket: str) -> dict:
    f = fs()
    objs = {p.split("/run/", 1)[1]: p for p in f.find(f"{bucket}/run")}
    shards = {n: f.cat_file(p) for n, p in objs.items() if n.startswith("shard-") and n.endswith(".tar")}
    manifests = {n[len("_manifest/"):-len(".json")] for n in objs if n.startswith("_manifest/")}
    keys = Counter()
    for data in shards.values():
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            keys.update(json.loads(tar.extractfile(m).read())["key"] for m in tar if m.name.endswith(".json"))
    return {"objects": set(objs), "shards": shards, "manifests": manifests, "keys": keys}


@pytest.mark.slow
def test_kill_and_resume_against_s3(s3, tmp_path):
    """Killed with a shard's tar uploaded but not its manifest; resumed from a fresh staging folder
    (remote state only) and killed again; finished from the first, stale staging folder."""
    bucket = new_bucket()
    rows = prompts(10)
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    args = [f"dataset.path={data}", f"output_dir=s3://{bucket}/run", *FAST]
    first, second = tmp_path / "staging-a", tmp_path / "staging-b"

    killed = cli(args, s3, first, kill="upload:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    state = remote_state(bucket)
    assert state["manifests"] == {"shard-u0000000-0000.tar"}  # shard 1's tar is up, its manifest is not
    assert "shard-u0000000-0001.tar" in state["shards"]
    committed = dict(state["shards"])
    del committed["shard-u0000000-0001.tar"]
    batching = fs().cat_file(f"{bucket}/run/_plan/batching.json")  # went up before the first shard
    assert batching == next(first.glob("*/_plan/batching.json")).read_bytes()

    again = cli(args, s3, second, kill="batch:3")  # another machine: nothing staged, the remote is the truth
    assert again.returncode == -signal.SIGKILL, again.stderr[-3000:]
    state = remote_state(bucket)
    assert set(state["shards"]) == state["manifests"]  # the cut-short upload was removed, not adopted
    assert next(second.glob("*/_plan/batching.json")).read_bytes() == batching  # came down with the plan
    assert max(state["keys"].values()) == 1 and {k: state["shards"][k] for k in committed} == committed

    done = cli(args, s3, first)
    assert done.returncode == 0, done.stderr[-3000:]
    state = remote_state(bucket)
    assert state["keys"] == Counter({r["key"]: 1 for r in rows})
    assert set(state["shards"]) == state["manifests"] and {k: state["shards"][k] for k in committed} == committed
    for name in state["objects"]:  # no temp, and no sidecar without its shard
        assert ".tmp" not in name
        if name.endswith((".parquet", "_stats.json")) and name.startswith("shard-"):
            assert name.replace("_stats.json", ".tar").replace(".parquet", ".tar") in state["shards"]
    f = fs()
    index = json.loads(f.cat_file(f"{bucket}/run/index.wids.json"))
    assert sorted(s["url"] for s in index["shardlist"]) == sorted(state["shards"])
    summary = json.loads(f.cat_file(f"{bucket}/run/summary.json"))
    assert summary["status"] == "complete" and summary["batching"]["source"] == "published"
    import pyarrow.dataset as ds

    table = ds.dataset(sorted(f.glob(f"{bucket}/run/shard-*.parquet")), filesystem=f).to_table()
    assert Counter(table.column("key").to_pylist()) == state["keys"]

    other = write_jsonl(tmp_path / "other.jsonl", prompts(3))
    refused = cli([a if not a.startswith("dataset.path=") else f"dataset.path={other}" for a in args], s3,
                  tmp_path / "staging-c")
    assert refused.returncode == 2 and "dataset.digest" in refused.stdout + refused.stderr, refused.stderr[-3000:]
