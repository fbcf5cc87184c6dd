"""The Ray path against a real local Ray cluster (tests/ray_cluster.py) and moto's real S3 server:
two actors on the tiny default write every key once, byte-identical to one process, with a local
output_dir and with an S3 one (the driver and the actors sharing no staging folder); an actor
killed mid-unit (`ray.kill`) has its unit finished by another; a driver killed mid-run resumes
when the command is rerun; bad input is refused before any actor starts."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from jobs.output.storage import STAGING_ENV  # noqa: E402
from tests.helpers import prompts, write_jsonl  # noqa: E402
from tests.ray_cluster import bcgen_actors, ray_cluster  # noqa: E402
from tests.s3_server import new_bucket, s3_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N = 40
# 4 units of 10; one thread per process (the run identity records it), so two actors fit two cores.
FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false", "plan.unit_items=10",
        "job.log_every_s=5"]
RAY = ["+cluster=ray", "ray.workers=2", "ray.gpus_per_worker=0", "ray.cpus_per_worker=0.5"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One S3 server and one Ray cluster for the module. The actors stage under `actors/`, the
    drivers under `driver/`: with an object store they share nothing but the bucket."""
    tmp = tmp_path_factory.mktemp("ray")
    saved = os.environ.get(STAGING_ENV)
    with s3_server() as s3env:
        os.environ[STAGING_ENV] = str(tmp / "actors")  # inherited by the cluster's processes, so by every actor
        try:
            with ray_cluster() as address:
                assert address.startswith("127."), address  # every process on the loopback
                yield {"address": address, "tmp": tmp, "s3": s3env}
        finally:
            if saved is None:
                os.environ.pop(STAGING_ENV, None)
            else:
                os.environ[STAGING_ENV] = saved


def _env(cluster) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1", RAY_DEDUP_LOGS="0")  # every actor's lines, as they are
    env[STAGING_ENV] = str(cluster["tmp"] / "driver")
    return env


def start(cluster, *overrides: str, ray: bool = True) -> subprocess.Popen:
    args = [*RAY, f"ray.address={cluster['address']}"] if ray else []
    return subprocess.Popen([sys.executable, "-m", "jobs.generate", *args, *FAST, *overrides], cwd=ROOT,
                            env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(cluster, *overrides: str, ray: bool = True, code: int = 0) -> str:
    proc = start(cluster, *overrides, ray=ray)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == code, f"exit {proc.returncode}\n{out[-6000:]}"
    return out


@pytest.fixture(scope="module")
def data(cluster) -> Path:
    return write_jsonl(cluster["tmp"] / "prompts.jsonl", prompts(N))


@pytest.fixture(scope="module")
def reference(cluster, data) -> dict:
    """One process, no Ray: every shard tar and parquet by name."""
    out = cluster["tmp"] / "single"
    run(cluster, f"dataset.path={data}", f"output_dir={out}", ray=False)
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name.startswith("shard-")
            and p.suffix in (".tar", ".parquet")}


def tar_keys(data: bytes) -> list:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [json.loads(tar.extractfile(m).read())["key"] for m in tar if m.name.endswith(".json")]


def every_key_once(tars: dict, log: str = "") -> None:
    counts = Counter(k for data in tars.values() for k in tar_keys(data))
    missing = sorted({r["key"] for r in prompts(N)} - set(counts))
    assert not missing and len(counts) == N, f"{len(missing)} key(s) missing: {missing[:30]}\n{log[-8000:]}"
    assert set(counts.values()) == {1}, [k for k, n in counts.items() if n > 1]


def local_files(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.name.startswith("shard-")
            and p.suffix in (".tar", ".parquet")}


def bucket_files(fs, root: str) -> dict:
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.find(root)
            if p.rsplit("/", 1)[-1].startswith("shard-") and p.endswith((".tar", ".parquet"))}


def s3fs():
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return fs


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_two_actors_write_every_key_once_as_one_process_does(cluster, data, reference):
    out = cluster["tmp"] / "local"
    t0 = time.monotonic()
    log = run(cluster, f"dataset.path={data}", f"output_dir={out}")
    outside = time.monotonic() - t0
    got = local_files(out)
    assert sorted(got) == sorted(reference)  # the same shards, by name: one per unit
    assert [n for n in got if got[n] != reference[n]] == []  # and byte for byte
    every_key_once({n: b for n, b in got.items() if n.endswith(".tar")})
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items_written"], summary["items_planned"]) == ("complete", N, N)
    actors = summary["ray"]["actors"]
    assert [a["status"] for a in actors] == ["finished", "finished"] and summary["ray"]["deaths"] == 0
    assert all(a["units_done"] >= 1 for a in actors) and sum(a["items_written"] for a in actors) == N
    index = json.loads((out / "index.wids.json").read_text())
    assert sum(s["nsamples"] for s in index["shardlist"]) == N
    assert os.listdir(out / "_plan" / "leases") == []  # the driver released every unit
    assert os.listdir(out / "_plan" / "workers") == []  # and its hold on the run, taken as it joined the plan
    assert "job 40/40 items (100.0%)" in log and "2 worker(s) on Ray" in log
    waited(summary, outside, log)


def waited(summary: dict, outside: float, log: str) -> None:
    """The wait a user sees, from the driver's start: its own start-up by part, and the first batch an
    actor (another process) handed to its sink, timed on the driver's clock (jobs/telemetry/startup.py)."""
    parts = summary["startup_seconds"]
    assert set(parts) == {"interpreter", "compose", "worker_imports", "checks", "connect"}, parts
    assert abs(summary["stage_seconds"]["startup"] - sum(parts.values())) < 1e-6
    first = summary["first_batch_s"]
    # after the driver's start-up and its plan (the actors start after it), within the outside wait
    assert sum(parts.values()) + summary["stage_seconds"]["plan"] - 0.01 <= first <= outside, (first, outside)
    assert set(summary["first_batch_ms"]) >= {"encode", "denoise", "decode"}, summary["first_batch_ms"]
    assert f"first batch {first:.1f}s after the process started" in log


def test_s3_output_dir_driver_and_actors_share_only_the_bucket(cluster, data, reference):
    root = f"{new_bucket()}/run"
    log = run(cluster, f"dataset.path={data}", f"output_dir=s3://{root}")
    fs = s3fs()
    got = bucket_files(fs, root)
    assert sorted(got) == sorted(reference) and [n for n in got if got[n] != reference[n]] == []
    every_key_once({n: b for n, b in got.items() if n.endswith(".tar")})
    names = [p.rsplit("/", 1)[-1] for p in fs.find(root)]
    tars = [n for n in names if n.startswith("shard-") and n.endswith(".tar")]
    assert sorted(n for n in names if n.endswith(".tar.json")) == sorted(f"{t}.json" for t in tars)  # a manifest each
    assert sorted(n for n in names if n.startswith("unit-") and n.endswith(".json")) == [
        f"unit-{u:07d}.json" for u in range(4)]  # the done markers
    summary = json.loads(fs.cat_file(f"{root}/summary.json"))
    assert (summary["status"], summary["items_written"], summary["output_dir"]) == ("complete", N, f"s3://{root}")
    # The actors staged and uploaded every shard; the driver's staging folder saw none of them.
    driver_staged = list((cluster["tmp"] / "driver").rglob("_manifest/*.json"))
    actor_staged = list((cluster["tmp"] / "actors").rglob("_manifest/*.json"))
    assert driver_staged == [] and len(actor_staged) == len(tars)
    index = json.loads(fs.cat_file(f"{root}/index.wids.json"))
    assert sum(s["nsamples"] for s in index["shardlist"]) == N
    assert "plan published to s3://" in log


def no_actors_left(timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while bcgen_actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert bcgen_actors() == []


def _mid_unit(out: Path, timeout_s: float = 600):
    """Wait for an actor with a unit that has a committed shard, no done marker and items still
    to come; returns (actor handle, unit)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, actor in bcgen_actors():
            try:
                inflight = ray.get(actor.progress.remote(), timeout=5)
            except Exception:  # noqa: BLE001 - starting or ending: try the next one
                continue
            for unit, n in inflight.items():
                started = (out / f"shard-u{unit:07d}-0000.tar").exists()
                if started and 2 < n < 20 and not (out / "_plan" / "done" / f"unit-{unit:07d}.json").exists():
                    return actor, unit
        time.sleep(0.05)
    raise AssertionError("no actor was seen mid-unit")


def test_an_actor_killed_mid_unit_has_its_unit_finished_by_another(cluster, data):
    import ray

    no_actors_left()  # the actors of earlier tests' drivers end with them, a moment later: not these
    out = cluster["tmp"] / "kill-actor"
    # 2 units of 20, a batch an item, 2 items a shard: a unit is mid-way for most of its run.
    proc = start(cluster, f"dataset.path={data}", f"output_dir={out}", "sink.maxcount=2", "plan.unit_items=20",
                 "bcg.batch_sizes=[1]")
    try:
        actor, unit = _mid_unit(out)
        before = {p.name: sha(p.read_bytes()) for p in out.glob(f"shard-u{unit:07d}-*.tar")}
        ray.kill(actor)
        log, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-6000:]
    got = local_files(out)
    every_key_once({n: b for n, b in got.items() if n.endswith(".tar")}, log)
    # What the dead actor committed stays, unchanged, and is the unit's: nothing generated twice.
    assert before and all(sha(got[n]) == h for n, h in before.items())
    marker = json.loads((out / "_plan" / "done" / f"unit-{unit:07d}.json").read_text())
    assert set(before) <= {s["url"] for s in marker["shards"]} and marker["items"] == 20
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["ray"]["deaths"] == 1
    assert unit in summary["ray"]["units_redone"]
    assert re.search(rf"died .*; its unit\(s\) \[[^\]]*\b{unit}\b", log), log[-3000:]


def test_the_driver_killed_and_rerun_resumes(cluster, data):
    root = f"{new_bucket()}/run"
    fs = s3fs()
    # A batch an item, so the kill lands while units are left; batch sizes grown by measurement
    # (bcg.batch_grow=on also measures on a CPU), which one actor must do for the whole run.
    slow = ["sink.maxcount=3", "bcg.batch_sizes=[1]", "bcg.batch_grow=on", "bcg.batch_grow_max=4"]
    proc = start(cluster, f"dataset.path={data}", f"output_dir=s3://{root}", *slow)
    try:
        deadline = time.monotonic() + 600
        done = []
        while time.monotonic() < deadline and not done and proc.poll() is None:
            fs.invalidate_cache()
            done = fs.glob(f"{root}/_plan/done/unit-*.json")
            time.sleep(0.2)
        assert done and proc.poll() is None, f"no unit done while the driver ran:\n{proc.communicate()[0][-6000:]}"
        proc.kill()  # SIGKILL: no summary, no release; its actors die with it (Ray's owner fate-sharing)
        first_log, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "measures them first" in first_log and first_log.count("batch sizing on") == 1, first_log[-4000:]
    fs.invalidate_cache()
    finished = sorted(p.rsplit("/", 1)[-1] for p in fs.glob(f"{root}/_plan/done/unit-*.json"))
    assert 1 <= len(finished) < 4, finished
    kept = {n: sha(b) for n, b in bucket_files(fs, root).items()}
    no_actors_left()  # Ray ended the killed driver's actors

    log = run(cluster, f"dataset.path={data}", f"output_dir=s3://{root}", *slow)
    got = bucket_files(fs, root)
    every_key_once({n: b for n, b in got.items() if n.endswith(".tar")})
    for marker in finished:  # units done before the kill were not touched
        unit = marker[len("unit-"):-len(".json")]
        names = [n for n in kept if n.startswith(f"shard-u{unit}-")]
        assert names and all(sha(got[n]) == kept[n] for n in names)
    summary = json.loads(fs.cat_file(f"{root}/summary.json"))
    assert summary["status"] == "complete"
    assert summary["items_written"] + summary["items_skipped_done"] == N
    assert f"resume: {10 * len(finished)} item(s) of done units" in log
    # The rerun's actors cut units with the sizes the first run measured and published.
    assert "batch sizing on" not in log and "measures them first" not in log
    published = json.loads(fs.cat_file(f"{root}/_plan/batching.json"))
    assert summary["batching"]["sizes"] == published["sizes"] and summary["batching"]["source"] == "published"


def test_bad_input_is_refused_on_the_driver_before_any_actor_starts(cluster):
    no_actors_left()
    bad = write_jsonl(cluster["tmp"] / "bad.jsonl", [{"key": "a", "prompt": "ok"},
                                                      {"key": "b", "prompt": "x", "width": 63}])
    out = cluster["tmp"] / "refused"
    log = run(cluster, f"dataset.path={bad}", f"output_dir={out}", code=2)
    assert f"{bad}:2" in log and "width" in log
    assert "worker(s) on Ray" not in log and not list(out.glob("shard-*"))
    assert bcgen_actors() == []


# -- the driver's pool over stand-in actors (tests/ray_standin.py): its paths, in seconds -----------

def _pool(tmp: Path, units: int, slots: int, actor_args, sized: bool = True, max_restarts: int = 0,
          actor_cls=None, ray_restarts: int = 0):
    """`max_restarts` is the pool's (a new actor per death); `ray_restarts` Ray's own, of one actor."""
    import ray

    from jobs.cluster.grants import Grants
    from jobs.cluster.pool import Pool
    from jobs.cluster.progress import DriverProgress
    from jobs.cluster.queue import UnitQueue
    from jobs.plan import Signature
    from jobs.plan.units import PlanManifest, UnitInfo, write_manifest
    from tests.ray_standin import StandIn

    plan_dir = tmp / "_plan"
    plan_dir.mkdir(parents=True)
    sig = Signature(height=64, width=64, text_bucket=64, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")
    infos = [UnitInfo(i, sig, 10, float(units - i)) for i in range(units)]
    write_manifest(plan_dir, PlanManifest(identity={}, dataset={"bad_rows": 0}, unit_items=10, units=infos))
    actor = ray.remote(actor_cls or StandIn).options(num_cpus=0, max_concurrency=8, max_restarts=ray_restarts)
    queue = UnitQueue(infos)
    pool = Pool(lambda part: actor.remote(**actor_args(part)), slots, queue, Grants(plan_dir, "test", 600.0),
                DriverProgress(10 * units, 0, False, 1e9), max_restarts, sized, True)
    return pool, queue


def _left(queue) -> list:
    out = []
    while (info := queue.take(None)) is not None:
        out.append(info.id)
    return out


def test_pool_an_actor_that_raises_stops_the_others_and_its_error_reaches_the_driver(cluster, tmp_path):
    from jobs.cluster.pool import WorkerFailed
    from jobs.worker.stop import StopFlag

    pool, queue = _pool(tmp_path, 6, 2, lambda part: {"unit_s": 0.2, "raise_on": 3})
    with pytest.raises(WorkerFailed, match="boom in unit 3"):
        pool.run(StopFlag())
    (other,) = pool.result.records  # the actor that did not raise was halted and returned its stats
    assert other["halted"] == "a worker failed"
    left = _left(queue)
    assert 3 in left and 3 not in other["done"]  # the failed unit is not done, and back in the queue
    assert sum(s.units_done for s in pool.slots) + len(left) == 6  # every other unit done once, or queued


def test_pool_replaces_a_dead_actor_and_every_unit_is_done_once(cluster, tmp_path):
    from jobs.worker.stop import StopFlag

    marker = tmp_path / "died"
    pool, queue = _pool(tmp_path, 6, 2, lambda part: {"die_once_on": 2, "marker": str(marker)}, max_restarts=1)
    result = pool.run(StopFlag())
    done = [u for r in result.records for u in r["done"]]  # the two that returned; the dead one may have
    assert marker.exists() and 2 in done and len(set(done)) == len(done)  # finished units before it died
    assert sum(a["units_done"] for a in result.actors) == 6  # each unit done once, across incarnations
    assert 2 in result.redone and [a["status"] for a in result.actors].count("died") == 1
    assert len(result.records) == 2 and len(queue) == 0  # the survivor and the dead one's replacement


def test_pool_a_unit_whose_own_call_reports_its_actors_death_goes_back_to_the_queue(cluster, tmp_path):
    """Regression for aa120fe: the call whose ray.get raised RayActorError was popped from the
    pool's calls before _died gathered the dead actor's units, so its unit was dropped (the job
    ended "complete" with it never done). Which of a dead actor's calls the pool sees failed first
    is Ray's timing; RunOutlivesItsProcess (tests/ray_standin.py) makes it a unit call every time:
    its other calls are retried by Ray on a restarted process, so only the unit calls fail."""
    from jobs.worker.stop import StopFlag
    from tests.ray_standin import RunOutlivesItsProcess

    marker, done_dir = tmp_path / "died", tmp_path / "done"
    done_dir.mkdir()
    # Units 0 and 1 (the costliest) go to one actor, which dies (os._exit) as its run() takes unit 0;
    # unit 0's call is then in flight on it, so it reports the death.
    pool, queue = _pool(tmp_path, 6, 2, lambda part: {"die_once_on": 0, "marker": str(marker),
                                                      "done_dir": str(done_dir)},
                        max_restarts=1, actor_cls=RunOutlivesItsProcess, ray_restarts=1)
    result = pool.run(StopFlag())
    assert marker.exists() and result.halted is None
    # Every unit's done marker, each written once (exclusively: a second raises in the actor, and the
    # pool with it), over every process: the dead one may have finished unit 1 before unit 0.
    done = sorted(int(p.name) for p in done_dir.iterdir())
    assert done == list(range(6)), f"units done {done}, redone {result.redone}, actors {result.actors}"
    assert 0 in result.redone and [a["status"] for a in result.actors].count("died") == 1
    assert sum(a["units_done"] for a in result.actors) == 6  # the pool's count agrees
    assert len(result.records) == 2 and len(queue) == 0  # the survivor and the dead one's replacement
    assert pool.grants.leaser.held == {}  # every unit's lease released: each was seen done


def test_pool_starts_one_actor_until_its_batch_sizes_are_published(cluster, tmp_path):
    from jobs.worker.stop import StopFlag

    pool, _ = _pool(tmp_path, 4, 2, lambda part: {"unit_s": 0.3}, sized=False)
    result = pool.run(StopFlag())
    first, second = sorted(result.records, key=lambda r: r["started"])
    assert second["started"] >= first["asked"]  # after the first asked for a unit (its sizes published)
    assert sorted(first["done"] + second["done"]) == [0, 1, 2, 3]


def test_pool_stop_halts_between_units_and_puts_the_unfinished_back(cluster, tmp_path):
    import threading

    from jobs.worker.stop import StopFlag

    pool, queue = _pool(tmp_path, 12, 2, lambda part: {"unit_s": 0.4})
    stop = StopFlag()

    def signal_after_the_first_unit():  # as SIGTERM's handler would, mid-run
        while pool.progress.done == 0:
            time.sleep(0.01)
        stop.reason = "SIGTERM"

    threading.Thread(target=signal_after_the_first_unit, daemon=True).start()
    result = pool.run(stop)
    assert result.halted == "SIGTERM" and [r["halted"] for r in result.records] == ["SIGTERM", "SIGTERM"]
    done = [u for r in result.records for u in r["done"]]
    assert 0 < len(done) < 12 and sorted(done + _left(queue)) == list(range(12))
