"""A sample is a function of its row (issue 30), at job level on the CPU: with `bcg.invariant=true`
the same key has the same latents (`latent_sha256`) and image bytes whether it was generated alone,
among other neighbours, at another pool, partitioned 3 ways or resumed after a kill with another
pool; with the mode off, batch 1 against batch 8 shows what the mode takes away (in process, on the
worker's stage pipeline). The run identity leaves the pool out while the mode is on.

Real jobs through the CLI on the trained sana_tiny at 64x64, 2 steps, one thread each (independent
jobs run two at a time on the CI's 2 cores). `jobs.verify --against` and its module
(jobs/output/compare.py) do the comparing.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch

from bcg.invariant import batch_invariant
from jobs.errors import UserError
from jobs.models.registry import get_family
from jobs.output.compare import compare_outputs
from jobs.plan import Batch
from jobs.plan.identity import Renderer
from jobs.plan.publish import open_plan
from jobs.worker.outputs import latent_sha256
from jobs.worker.pipeline import Pipeline
from padding import get_padder
from tests.helpers import compose_cfg, prompts, tiny_pipeline, write_jsonl
from tests.test_resume_kill import cli, log_of
from tests.test_scale_workers import finish, start
from tests.test_stages import SIG, items

FAST = ["sampling.steps=2", "sampling.height=64", "sampling.width=64", "job.progress=false"]
ON = [*FAST, "bcg.invariant=true"]
KEY = "k005"  # the key the job of one prompt makes


def _all(procs: dict) -> dict:
    """Wait for every process; {name: (rc, log)}."""
    return {name: finish(p) for name, p in procs.items()}


def _two_at_a_time(jobs: dict, env: dict) -> dict:
    """Run independent jobs (name -> CLI args, or a function that runs its own processes one after
    another; `env`: name -> its extra variables), at most two at once, each started as soon as one
    before it ends (list the longest first); {name: (rc, log), or what its function returned}."""
    def run(name):
        return jobs[name]() if callable(jobs[name]) else finish(start(*jobs[name], env=env.get(name)))

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("contract")
    rows = prompts(8)
    eight = write_jsonl(tmp / "eight.jsonl", rows)
    one = write_jsonl(tmp / "one.jsonl", [r for r in rows if r["key"] == KEY])
    shifted = write_jsonl(tmp / "shifted.jsonl", prompts(10)[4:])  # k004..k009, another job seed below
    out = {name: tmp / name for name in ("eight", "one", "seed", "part", "resumed")}
    chain = [f"dataset.path={eight}", f"output_dir={out['resumed']}", *ON, "sink.maxcount=3"]
    jobs = {
        "eight": [f"dataset.path={eight}", *ON, "bcg.batch_sizes=[1,2,4,8]", f"output_dir={out['eight']}"],
        "one": [f"dataset.path={one}", *ON, "bcg.batch_sizes=[1]", f"output_dir={out['one']}"],  # alone
        "seed": [f"dataset.path={shifted}", *ON, "bcg.batch_sizes=[2,4]", "sampling.seed=7",
                 f"output_dir={out['seed']}"],
        # killed in its third batch of 2, after one committed shard of 3 (resumed below with batches of 3)
        "killed": [*chain, "bcg.batch_sizes=[2]"],
    }
    done = _two_at_a_time(jobs, env={"killed": {"BCGEN_TEST_KILL_AT": "batch:3"}})
    run_json = (out["resumed"] / "run.json").read_bytes()
    # 3 units of 3, 3 and 2 items, cut at batch 3, leased by three workers started together
    part = [f"dataset.path={eight}", f"output_dir={out['part']}", *ON, "bcg.batch_sizes=[3]", "plan.unit_items=3"]
    planned = cli(*part, module=("-m", "jobs.plan"))
    assert planned.returncode == 0, log_of(planned)
    done.update(_all({f"part{i}": start(*part, f"job.partition={i}/3") for i in range(3)}))
    resumed = cli(*chain, "bcg.batch_sizes=[3]")
    return {"out": out, "done": done, "resumed": resumed, "run_json": run_json}


def jsons(out: Path) -> dict:
    """key -> its json, read back with webdataset."""
    import webdataset as wds

    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    return {(m := json.loads(s["json"]))["key"]: m for s in wds.WebDataset(urls, shardshuffle=False)}


def verify_against(a: Path, b: Path):
    return cli(str(a), "--against", str(b), module=("-m", "jobs.verify"))


@pytest.mark.slow
def test_every_job_ran(runs):
    for name, (rc, log) in runs["done"].items():
        want = -9 if name == "killed" else 0  # SIGKILLed by its own test hook
        assert rc == want, f"{name}: exit {rc}\n{log}"
    assert runs["resumed"].returncode == 0, log_of(runs["resumed"])


@pytest.mark.slow
def test_a_key_is_the_same_bytes_alone_among_others_at_any_pool_partitioned_and_resumed(runs):
    out = runs["out"]
    eight = out["eight"]
    alone = compare_outputs(eight, out["one"])
    assert alone.identical.first == (KEY,) and not alone.differing
    assert len(alone.only_here) == 7 and not alone.only_there
    for name in ("part", "resumed"):
        cmp = compare_outputs(eight, out[name])
        assert cmp.same and len(cmp.identical) == 8, (name, cmp.lines())
    # ... and the batching really was different each time
    sizes = {name: jsons(out[name])[KEY]["batch_size"] for name in ("eight", "one", "part", "resumed")}
    assert sizes == {"eight": 8, "one": 1, "part": 3, "resumed": 3}, sizes
    parts = json.loads((out["part"] / "summary.json").read_text())["parts"]
    assert sum(p["items_written"] > 0 for p in parts) >= 2, parts  # the units were shared out, not done by one
    by_size = Counter(m["batch_size"] for m in jsons(out["resumed"]).values())
    assert by_size == Counter({2: 3, 3: 5}), by_size  # one shard of 3 before the kill, the rest at the new pool


@pytest.mark.slow
def test_verify_against_says_identical_and_exits_0(runs):
    out = runs["out"]
    proc = verify_against(out["eight"], out["part"])
    assert proc.returncode == 0, log_of(proc)
    assert "every one of 8 key(s) identical" in log_of(proc)


@pytest.mark.slow
def test_verify_against_reports_differing_and_missing_keys_of_another_seed(runs):
    out = runs["out"]
    cmp = compare_outputs(out["eight"], out["seed"])
    assert not cmp.identical and cmp.differing.first == ("k004", "k005", "k006", "k007")
    assert all("latent_sha256" in what and "jpg" in what for what in cmp.differs_in.values()), cmp.differs_in
    assert cmp.only_here.first == ("k000", "k001", "k002", "k003") and cmp.only_there.first == ("k008", "k009")
    assert not cmp.same
    proc = verify_against(out["eight"], out["seed"])
    text = log_of(proc)
    assert proc.returncode == 1, text
    assert "differing: 4 key(s), e.g. k004 (jpg, latent_sha256)" in text
    assert f"missing from {out['seed']}: 4 key(s) that only {out['eight']} has, e.g. k000, k001, k002, k003" in text
    assert f"missing from {out['eight']}: 2 key(s) that only {out['seed']} has, e.g. k008, k009" in text


@pytest.mark.slow
def test_latent_sha256_is_in_every_json_and_the_parquet(runs):
    eight = runs["out"]["eight"]
    table = ds.dataset(sorted(str(p) for p in eight.glob("*.parquet"))).to_table(columns=["key", "latent_sha256"])
    parquet = dict(zip(table.column("key").to_pylist(), table.column("latent_sha256").to_pylist()))
    from_json = {k: m["latent_sha256"] for k, m in jsons(eight).items()}
    assert parquet == from_json and len(parquet) == 8
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in parquet.values())
    assert len(set(parquet.values())) == 8  # one digest a row, not a batch's


@pytest.mark.slow
def test_summary_reports_the_mode_and_its_kernels(runs):
    out = runs["out"]
    inv = json.loads((out["eight"] / "summary.json").read_text())["invariant"]
    assert inv["enabled"] and inv["installed"] and inv["devices"] == ["cpu"]
    assert inv["calls"]["cpu.addmm"] > 0 and inv["calls"]["cpu.convolution"] > 0
    assert not [op for op in inv["calls"] if op.endswith(".fallback")], inv["calls"]
    merged = json.loads((out["part"] / "summary.json").read_text())["invariant"]  # over the three parts
    parts = [json.loads(p.read_text())["invariant"] for p in sorted((out["part"] / "_summary").glob("part-*.json"))]
    assert len(parts) == 3 and merged["enabled"]
    assert Counter(merged["calls"]) == sum((Counter(p.get("calls", {})) for p in parts), Counter())


@pytest.mark.slow
def test_with_the_mode_a_rerun_with_another_pool_joins_the_run(runs):
    ident = json.loads(runs["run_json"])
    assert ident["invariant"] is True and "batching" not in ident
    # the run killed at pool [2] was resumed at [3] (test_every_job_ran): one run, run.json untouched
    assert (runs["out"]["resumed"] / "run.json").read_bytes() == runs["run_json"]
    assert "joining the plan in" in log_of(runs["resumed"]) and runs["resumed"].returncode == 0
    # each worker kept its own pool (test_a_key...: batches of 2, then of 3): none was published to bind the next
    assert not (runs["out"]["resumed"] / "_plan" / "batching.json").exists()


@pytest.mark.slow
def test_an_output_without_latent_digests_is_refused_naming_the_fix(runs, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(runs["out"]["eight"], old)
    shard = sorted(old.glob("shard-*.tar"))[0]
    _drop_json_field(shard, "latent_sha256")  # what bcgen wrote before the digest existed
    proc = verify_against(old, runs["out"]["eight"])
    assert proc.returncode == 2, log_of(proc)
    assert "have no latent_sha256" in log_of(proc) and "Regenerate that run with this version" in log_of(proc)


# -- the run identity, planned only (refused before any model loads) -----------------------------------
def test_identity_without_the_mode_refuses_another_pool_naming_batching(tmp_path):
    """On the CPU the mode is off unless set (bcg.invariant=null: on with CUDA only), so the pool is in
    the identity once the run's first worker settled its device part; `jobs.plan` (device=auto, no
    renderer) leaves both pending."""
    data = write_jsonl(tmp_path / "p.jsonl", prompts(3))
    out = tmp_path / "out"
    args = [f"dataset.path={data}", f"output_dir={out}", *FAST]
    planned = cli(*args, "bcg.batch_sizes=[1]", module=("-m", "jobs.plan"))
    assert planned.returncode == 0, log_of(planned)
    pending = json.loads((out / "run.json").read_text())
    assert pending["device"] == "pending" and "batching" not in pending and "invariant" not in pending
    cfg = compose_cfg([*args, "bcg.batch_sizes=[1]"])  # its first worker, as the CLI's (one thread)
    open_plan(cfg, out, get_family(cfg.model.family).spatial_divisor(cfg.model), renderer=Renderer("cpu", 1))
    assert json.loads((out / "run.json").read_text())["batching"]["batch_sizes"] == [1]
    refused = cli(*args, "bcg.batch_sizes=[8]")
    assert refused.returncode == 2 and "batching.batch_sizes: [1] -> [8]" in log_of(refused), log_of(refused)
    mixed = cli(*args, "bcg.batch_sizes=[1]", "bcg.invariant=true")  # the mode is part of the identity too
    assert mixed.returncode == 2 and "invariant: null -> true" in log_of(mixed), log_of(mixed)


def test_identity_with_the_mode_has_no_pool(tmp_path):
    """device=cuda: the device part is known without a worker (`jobs.plan` runs no tensor op)."""
    data = write_jsonl(tmp_path / "p.jsonl", prompts(3))
    args = [f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", *ON, "device=cuda"]
    for pool in ("[1]", "[2,3]"):
        planned = cli(*args, f"bcg.batch_sizes={pool}", "bcg.pad_short_batches=false", module=("-m", "jobs.plan"))
        assert planned.returncode == 0, log_of(planned)
    ident = json.loads((tmp_path / "out" / "run.json").read_text())
    assert ident["invariant"] is True and "batching" not in ident


def _drop_json_field(shard: Path, name: str) -> None:
    members = []
    with tarfile.open(shard) as tar:
        for info in tar.getmembers():
            data = tar.extractfile(info).read()
            if info.name.endswith(".json"):
                meta = json.loads(data)
                meta.pop(name)
                data = json.dumps(meta).encode()
            members.append((info, data))
    with tarfile.open(shard, "w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# -- the digest itself, and the worker's stages under the mode (in process) -------------------------
def test_latent_sha256_folds_in_dtype_and_shape_and_reads_the_row_contiguous():
    video = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    audio = torch.linspace(-1, 1, 2 * 5).reshape(2, 5).to(torch.bfloat16)
    want = hashlib.sha256()
    for t in (video, audio):
        row = t[1].contiguous()
        want.update(f"{str(row.dtype)[len('torch.'):]}{list(row.shape)}".encode())
        want.update(row.view(torch.uint8).numpy().tobytes())
    assert latent_sha256([video, audio], 1) == want.hexdigest()
    assert want.hexdigest() != latent_sha256([video, audio], 0)
    # a transposed view hashes as its contiguous copy; another shape of the same bytes is another digest
    assert latent_sha256([video.transpose(1, 2).contiguous().transpose(1, 2)], 1) == latent_sha256([video], 1)
    assert latent_sha256([video.reshape(2, 4, 3)], 1) != latent_sha256([video], 1)
    assert latent_sha256([video.double()], 1) != latent_sha256([video], 1)


@pytest.fixture(scope="module")
def engine():
    """The worker's stage pipeline on sana_tiny (trained weights), 64x64, 2 steps, CFG, no graphs."""

    cfg, fam, pipe = tiny_pipeline("sana_tiny", "sampling.height=64", "sampling.width=64", "sampling.steps=2")
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    return Pipeline(cfg, fam, pipe, padder, None, "cpu")


def test_stage_pipeline_digests_each_real_row_and_drops_dummies(engine):

    with batch_invariant():
        two = engine.generate(Batch(SIG, items(2), 2))
        alone = engine.generate(Batch(SIG, items(1, start=1), 2))  # k1 and a dummy copy, dropped with the pixels
    assert len(two.latent_sha256) == 2 and two.latent_sha256[0] != two.latent_sha256[1]
    assert alone.latent_sha256 == two.latent_sha256[1:] and len(alone.images) == 1
    assert (alone.images[0] == two.images[1]).all()


def test_with_the_mode_off_a_row_batched_by_8_has_other_latents_than_alone(engine):
    """What the contract changes: without the mode MKL and oneDNN compute a row differently at batch 8
    than at batch 1 (benchmarks/results/batch_invariance_cpu.md). Measured here (2-core AVX512 EPYC, torch
    2.13): the latents of 8 of 8 rows differ, their uint8 pixels in 2, so equal images hide what the
    digest shows. Should a CPU ever agree on every row, this fails and
    says so: the mode's difference would then not be visible on it."""

    rows = items(8)
    batched = engine.generate(Batch(SIG, rows, 8))
    alone = [engine.generate(Batch(SIG, [it], 1)) for it in rows]
    latents = [i for i in range(8) if batched.latent_sha256[i] != alone[i].latent_sha256[0]]
    pixels = [i for i in range(8) if not (batched.images[i] == alone[i].images[0]).all()]
    assert latents, "batch 1 and 8 gave every row the same latents with bcg.invariant=false"
    assert set(pixels) <= set(latents)  # a pixel cannot change unless the latents did
    assert len(pixels) < len(latents), f"pixels differ in rows {pixels}, latents in {latents}"


def test_the_mode_refuses_the_compiled_forward():
    for tier in ("bcg.compile=true", "bcg.fusions=fast"):
        with pytest.raises(UserError, match="bcg.invariant=true cannot hold with the compiled forward"):
            compose_cfg(["bcg.invariant=true", tier, "output_dir=/tmp/x"])
    assert compose_cfg(["bcg.invariant=true", "output_dir=/tmp/x"]).bcg.invariant is True
    assert compose_cfg(["output_dir=/tmp/x"]).bcg.invariant is None  # null: on with CUDA, off on the CPU
    for tier in ("bcg.compile=true", "bcg.fusions=fast"):  # null gives way to the compiled forward
        bcg = compose_cfg([tier, "output_dir=/tmp/x"]).bcg
        assert not bcg.invariant_on("cuda") and compose_cfg(["output_dir=/tmp/x"]).bcg.invariant_on("cuda")
    assert not compose_cfg(["output_dir=/tmp/x"]).bcg.invariant_on("cpu")
