"""Faults while running: OOM splits a batch, NaN/Inf images are flagged, a full disk stops the job
cleanly with committed shards intact, Ctrl-C commits and says how to resume."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from jobs.worker.pipeline import Pipeline
from jobs.models.registry import get_family
from jobs.plan import Batch, Item, Signature, derive_seed
from padding import get_padder
from tests.helpers import compose_cfg, prompts, write_jsonl
from tests.test_job_e2e import FAST, ROOT, run_cli


class OomAbove:
    """The real SANA family, except the allocator 'fails' above a batch size (CPUs cannot OOM on cue)."""

    def __init__(self, family, limit: int):
        self.family, self.limit, self.calls = family, limit, []

    def __getattr__(self, name):
        return getattr(self.family, name)

    def denoise(self, pipe, request):
        self.calls.append(len(request.seeds))
        if len(request.seeds) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return self.family.denoise(pipe, request)


class DecodeOomAbove(OomAbove):
    """The same, failing in the decode: the stage a warm-up runs first (Pipeline.warm_decode)."""

    def denoise(self, pipe, request):
        return self.family.denoise(pipe, request)

    def decode(self, pipe, latents, request):
        self.calls.append(len(request.seeds))
        if len(request.seeds) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return self.family.decode(pipe, latents, request)


@pytest.fixture(scope="module")
def tiny():
    cfg = compose_cfg(["output_dir=/tmp/x", "sampling.height=64", "sampling.width=64", "sampling.steps=2"])
    fam = get_family("sana")
    pipe = fam.build_tiny(cfg.model, torch.float32)
    pipe.set_progress_bar_config(disable=True)
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=300)
    return cfg, fam, pipe, padder


def batch_of(n: int) -> Batch:
    sig = Signature(height=64, width=64, text_bucket=64, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")
    items = [Item(key=f"k{i}", prompt=f"a small house {i}", negative_prompt="", seed=derive_seed(0, f"k{i}"),
                  signature=sig, text_tokens=8, truncated=False, source=f"t.jsonl:{i + 1}") for i in range(n)]
    return Batch(signature=sig, items=items, size=n)


def test_oom_splits_the_batch_and_keeps_every_image(tiny):
    cfg, fam, pipe, padder = tiny
    flaky = OomAbove(fam, limit=2)
    res = Pipeline(cfg, flaky, pipe, padder, None, "cpu").generate(batch_of(4))
    ref = Pipeline(cfg, fam, pipe, padder, None, "cpu").generate(batch_of(4))
    assert flaky.calls == [4, 4, 2, 2]  # the batch, once more at its shape, then its halves
    assert res.batch_size == 4 and len(res.images) == 4
    # each row's json names the shape it ran at (the halves'), not the batch's: its bytes follow that shape
    assert [m["batch_size"] for m in res.meta] == [2, 2, 2, 2] and not any("batch_size" in m for m in ref.meta)
    # per-item seeds: the split batch gives the same images, item by item (CPU, float32)
    for a, b in zip(res.images, ref.images):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_a_decode_warm_up_that_runs_out_of_memory_gives_way_to_the_batch_s_own_split(tiny):
    """The scheduler's warm-up decodes the batch's shape first; out of memory there, it is skipped, and the
    batch is made as without it: its decode splits (the images the same), and the job goes on."""
    from jobs.worker.dispatcher import CaptureDispatcher
    from jobs.worker.scheduler import StageScheduler

    cfg, fam, pipe, padder = tiny
    flaky = DecodeOomAbove(fam, limit=2)
    engine = Pipeline(cfg, flaky, pipe, padder, None, "cpu")
    (res,) = StageScheduler(engine, CaptureDispatcher(None, cfg.bcg), overlap=True).run([batch_of(4)], lambda: False)
    assert flaky.calls == [4, 4, 4, 2, 2]  # the warm-up, the batch's own decode and its retry, its halves
    ref = Pipeline(cfg, fam, pipe, padder, None, "cpu").generate(batch_of(4))
    assert res.items == ref.items and engine.oom_splits == 1
    assert [m["batch_size"] for m in res.meta] == [2, 2, 2, 2]
    for a, b in zip(res.images, ref.images):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_oom_at_batch_one_is_raised(tiny):
    cfg, fam, pipe, padder = tiny
    flaky = OomAbove(fam, limit=0)
    with pytest.raises(torch.OutOfMemoryError):
        Pipeline(cfg, flaky, pipe, padder, None, "cpu").generate(batch_of(1))
    assert flaky.calls == [1, 1]  # tried once more before giving up


class OomOnce(OomAbove):
    """Out of memory on the first call only: memory that was held, not needed."""

    def denoise(self, pipe, request):
        self.calls.append(len(request.seeds))
        if len(self.calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return self.family.denoise(pipe, request)


def test_an_oom_that_does_not_recur_keeps_the_batchs_shape_and_bytes(tiny):
    # A split's rows follow its halves' shapes (issue 30); the same shape tried once more keeps them.
    cfg, fam, pipe, padder = tiny
    flaky = OomOnce(fam, limit=0)
    engine = Pipeline(cfg, flaky, pipe, padder, None, "cpu")
    res = engine.generate(batch_of(4))
    ref = Pipeline(cfg, fam, pipe, padder, None, "cpu").generate(batch_of(4))
    assert flaky.calls == [4, 4] and engine.oom_splits == 0
    assert not any("batch_size" in m for m in res.meta)  # the batch's own size: no split
    assert all(np.array_equal(a, b) for a, b in zip(res.images, ref.images))


def test_nonfinite_images_are_flagged(tiny):
    cfg, fam, pipe, padder = tiny
    import copy

    poisoned = copy.deepcopy(pipe)
    with torch.no_grad():
        poisoned.transformer.proj_out.weight.fill_(float("nan"))
    res = Pipeline(cfg, fam, poisoned, padder, None, "cpu").generate(batch_of(2))
    assert res.finite == [False, False]
    assert all(im.dtype == np.uint8 for im in res.images)  # still encodable: NaN -> 0, flagged instead


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _mount_tmpfs(directory: Path, size: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "none", str(directory)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here ({err})")


def test_disk_full_stops_cleanly_and_resumes(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", prompts(12))
    out = tmp_path / "small"
    _mount_tmpfs(out, "96k")  # room for a shard or two of 64x64 PNGs, not for all twelve
    try:
        proc = run_cli(f"dataset.path={data}", f"output_dir={out}", "sink=png", "sink.maxcount=2", *FAST, check=False)
        assert proc.returncode != 0
        err = proc.stdout + proc.stderr
        assert "No space left on device" in err and "resum" in err
        committed = {p.name: sha(p) for p in out.glob("shard-*.tar")}
        assert committed, "at least one shard should have committed before the disk filled"
        import tarfile

        for name in committed:  # nothing torn under a final name: every committed shard reads back whole
            with tarfile.open(out / name) as tf:
                assert len(tf.getnames()) == 6  # 2 samples x (png, txt, json)
        # Free space (grow the same tmpfs, its files stay) and rerun the same command: it resumes.
        subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)
        run_cli(f"dataset.path={data}", f"output_dir={out}", "sink=png", "sink.maxcount=2", *FAST)
        assert all(sha(out / n) == h for n, h in committed.items())  # committed shards byte for byte
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "complete"
        assert summary["items_skipped_done"] == 2 * len(committed)
    finally:
        subprocess.run(["umount", str(out)], check=False)


def test_ctrl_c_commits_complete_samples_and_says_how_to_resume(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", prompts(40))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "jobs.generate", f"dataset.path={data}", f"output_dir={out}", "sink.maxcount=3",
            "bcg.batch_sizes=[1]", *FAST]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(list(out.glob("shard-*.tar"))) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, log
    assert "Rerun the same command to resume" in log
    before = {p.name: sha(p) for p in out.glob("shard-*.tar")}
    assert len(before) >= 2
    run_cli(f"dataset.path={data}", f"output_dir={out}", "sink.maxcount=3", "bcg.batch_sizes=[1]", *FAST)
    after = {p.name: sha(p) for p in out.glob("shard-*.tar")}
    assert all(after[n] == h for n, h in before.items())  # committed shards untouched
    import webdataset as wds

    keys = [json.loads(s["json"])["key"] for s in wds.WebDataset([str(out / n) for n in sorted(after)],
                                                                   shardshuffle=False)]
    assert sorted(keys) == sorted(r["key"] for r in prompts(40))  # every item exactly once


def _poisoned_loader(monkeypatch):
    """The real tiny pipeline, with its output projection poisoned: every image comes out NaN."""
    import jobs.worker.loop as loop
    from jobs.worker.model import load_pipeline

    def load(family, cfg, device, parts=None):
        pipe = load_pipeline(family, cfg, device, parts)
        with torch.no_grad():
            pipe.transformer.proj_out.weight.fill_(float("nan"))
        return pipe

    monkeypatch.setattr(loop, "load_pipeline", load)


@pytest.mark.parametrize("policy", ["record", "ledger"])
def test_nonfinite_images_reach_json_summary_or_ledger(tmp_path, monkeypatch, policy):
    from jobs.worker.run import run_job

    _poisoned_loader(monkeypatch)
    data = write_jsonl(tmp_path / "p.jsonl", prompts(3))
    out = tmp_path / "out"
    cfg = compose_cfg([f"dataset.path={data}", f"output_dir={out}", f"job.on_nonfinite={policy}", *FAST])
    stats = run_job(cfg)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nonfinite"] == 3 and sorted(summary["nonfinite_keys"]) == ["k000", "k001", "k002"]
    if policy == "record":
        import webdataset as wds

        metas = [json.loads(s["json"]) for s in wds.WebDataset([str(p) for p in out.glob("shard-*.tar")],
                                                                 shardshuffle=False)]
        assert len(metas) == 3 and all(m["nonfinite"] for m in metas)
    else:
        assert stats.items_written == 0 and not list(out.glob("shard-*.tar"))
        ledger = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
        assert sorted(r["key"] for r in ledger) == ["k000", "k001", "k002"]
        assert all("NaN/Inf" in r["reason"] for r in ledger)
