"""The weights under `model.path` are part of the run's identity (jobs/plan/weights_digest.py): a
checkpoint saved here as the real preset loads it, a run of it, then the weights changed in place.

A plain resume stats the files and reads none; a touched file is hashed again and joins; weights
rewritten in place are refused naming the file and the fix, with nothing committed touched;
job.overwrite=true starts over with the new weights."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from jobs.models.checkpoint import weight_files
from jobs.models.registry import get_family
from tests.helpers import compose_cfg, prompts, write_jsonl
from tests.test_trust_property import FAST, indexed_keys, run_job

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny SANA pipeline saved as a diffusers folder, plus what a load never reads."""
    cfg = compose_cfg(["output_dir=/tmp/x"])
    fam = get_family("sana")
    pipe = fam.build_tiny(cfg.model, torch.float32)
    path = tmp_path_factory.mktemp("ckpt") / "sana_tiny_diffusers"
    fam.save(pipe, path)
    (path / "README.md").write_text("a model card\n")
    (path / ".cache").mkdir()
    (path / ".cache" / "download.lock").write_text("")
    return path


def _args(ckpt: Path, data: Path, out: Path, *extra: str) -> list:
    return ["model=sana", f"model.path={ckpt}", "model.dtype=float32", "model.complex_human_instruction=null",
            f"dataset.path={data}", f"output_dir={out}", *FAST, *extra]


def _shards(out: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("shard-*.tar"))}


def _rewrite_in_place(path: Path) -> None:
    """New values in one tensor, saved over the same file: same size, new bytes (retrained weights)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 0.5
    size = path.stat().st_size
    save_file(tensors, path, metadata={"format": "pt"})
    assert path.stat().st_size == size


def test_what_is_digested_is_what_a_load_can_read(checkpoint):
    names = weight_files(str(checkpoint))
    assert WEIGHTS in names and "model_index.json" in names and "vae/config.json" in names
    assert "README.md" not in names and not any(n.startswith(".cache") for n in names)


def test_weights_changed_in_place_are_refused_naming_the_file(checkpoint, tmp_path, caplog):
    import shutil

    torch.set_num_threads(1)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    rows = prompts(4)
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out"
    assert run_job(_args(ckpt, data, out)) == 0
    plan = json.loads((out / "_plan" / "plan.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert [f["path"] for f in plan["weights"]["files"]] == weight_files(str(ckpt))
    assert run["model"]["weights"] == plan["weights"]["digest"]
    committed = _shards(out)

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert run_job(_args(ckpt, data, out)) == 0  # a plain resume: stat only
    assert "hashing" not in caplog.text and "nothing to generate" in caplog.text
    caplog.clear()
    os.utime(ckpt / WEIGHTS)  # a touch: hashed again, the same bytes, joined
    with caplog.at_level(logging.INFO):
        assert run_job(_args(ckpt, data, out)) == 0
    assert f"weight file {ckpt / WEIGHTS} changed size or mtime since it was planned: hashing it" in caplog.text

    _rewrite_in_place(ckpt / WEIGHTS)
    caplog.clear()
    assert run_job(_args(ckpt, data, out)) == 2
    refusal = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refusal) == 1 and refusal[0].startswith(
        f"model.path={str(ckpt)!r}: the weights changed since this output_dir's run was planned: {WEIGHTS} changed "
        f"(sha256 ")
    assert "give these weights a new output_dir, or job.overwrite=true" in refusal[0]
    assert _shards(out) == committed and json.loads((out / "run.json").read_text()) == run  # nothing touched

    (ckpt / "vae" / "extra.safetensors").write_bytes((ckpt / "vae" / "diffusion_pytorch_model.safetensors").read_bytes())
    caplog.clear()
    assert run_job(_args(ckpt, data, out)) == 2
    assert "vae/extra.safetensors is new" in caplog.text
    (ckpt / "vae" / "extra.safetensors").unlink()

    assert run_job(_args(ckpt, data, out, "job.overwrite=true")) == 0  # start over with these weights
    again = json.loads((out / "run.json").read_text())
    assert again["model"]["weights"] != run["model"]["weights"]
    assert set(_shards(out)) == set(committed) and _shards(out) != committed  # other weights, other images
    assert indexed_keys(out) == {r["key"]: 1 for r in rows}


def test_a_plan_made_before_weight_digests_joins_unchecked(checkpoint, tmp_path):
    """A run planned by an older bcgen has no weights record in plan.json and none in run.json: a job
    joins it as before (there is nothing to compare with) rather than refusing it as another run."""
    from jobs.plan.publish import open_plan

    data = write_jsonl(tmp_path / "p.jsonl", prompts(2))
    out = tmp_path / "out"
    cfg = compose_cfg(_args(checkpoint, data, out))
    divisor = get_family(cfg.model.family).spatial_divisor(cfg.model)
    made = open_plan(cfg, out, divisor)
    assert made.identity["model"]["weights"] == made.weights["digest"]
    plan_file, run_file = out / "_plan" / "plan.json", out / "run.json"
    plan = json.loads(plan_file.read_text())
    del plan["weights"], plan["identity"]["model"]["weights"]
    plan_file.write_text(json.dumps(plan, indent=1) + "\n")
    run = json.loads(run_file.read_text())
    del run["model"]["weights"]
    run_file.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    joined = open_plan(cfg, out, divisor)
    assert joined.weights == {} and joined.n_items == 2
    assert json.loads(run_file.read_text()) == run  # joined, not claimed anew


def test_a_fresh_run_on_the_same_weights_reads_none_of_them(checkpoint, tmp_path, caplog, monkeypatch):
    """The weights' sha256 come from the per-user digest cache (jobs/plan/digest_cache.py) when their
    stat stamps are unchanged: the second fresh output_dir hashes nothing, with the same digest."""
    from jobs.plan.publish import open_plan

    monkeypatch.setenv("BCGEN_DIGEST_CACHE", str(tmp_path / "file_digests.json"))
    data = write_jsonl(tmp_path / "p.jsonl", prompts(2))
    n = len(weight_files(str(checkpoint)))
    made = []
    for name, hashed in (("first", n), ("second", 0)):
        cfg = compose_cfg(_args(checkpoint, data, tmp_path / name))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="jobs.plan"):
            made.append(open_plan(cfg, tmp_path / name, get_family(cfg.model.family).spatial_divisor(cfg.model)))
        assert f"{n} files, {n - hashed} from the digest cache" in caplog.text and f", {hashed} hashed" in caplog.text
    assert made[0].weights == made[1].weights and made[0].weights["digest"]


def test_the_same_weights_at_another_path_join_the_run_and_other_weights_there_are_refused(
        checkpoint, tmp_path, caplog, monkeypatch):
    """A checkpoint copied to each node's local disk is the run's weights wherever it lies: a job naming the
    copy joins (and generates) under the path the run was planned with; a copy whose bytes differ is another
    model, refused as before; a folder whose files differ in name or size is told apart without hashing."""
    import shutil

    from jobs.errors import UserError
    from jobs.plan.publish import open_plan

    monkeypatch.setenv("BCGEN_DIGEST_CACHE", str(tmp_path / "file_digests.json"))
    torch.set_num_threads(1)
    data = write_jsonl(tmp_path / "p.jsonl", prompts(2))
    out = tmp_path / "out"
    planned = compose_cfg(_args(checkpoint, data, out))
    divisor = get_family(planned.model.family).spatial_divisor(planned.model)
    made = open_plan(planned, out, divisor)
    run = json.loads((out / "run.json").read_text())
    assert run["model"]["path"] == str(checkpoint)

    local = tmp_path / "node-local" / "sana"
    shutil.copytree(checkpoint, local)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jobs.plan"):
        joined = open_plan(compose_cfg(_args(local, data, out)), out, divisor)
    assert joined.identity == made.identity and json.loads((out / "run.json").read_text()) == run
    assert f"model.path={local} holds the weights the run was planned with at model.path={checkpoint}" in caplog.text
    assert run_job(_args(local, data, out)) == 0  # the worker loads the copy and generates the run's items
    assert indexed_keys(out) == {r["key"]: 1 for r in prompts(2)}
    run = json.loads((out / "run.json").read_text())  # its device part settled by that worker
    assert run["model"]["path"] == str(checkpoint) and run["model"]["weights"] == made.weights["digest"]

    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    _rewrite_in_place(other / WEIGHTS)  # same names and sizes, other bytes: hashed, then refused
    with pytest.raises(UserError, match=rf'model\.path: "{checkpoint}" -> "{other}"'):
        open_plan(compose_cfg(_args(other, data, out)), out, divisor)
    (other / "vae" / "extra.safetensors").write_bytes(b"x")  # another file list: refused without hashing
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jobs.plan"), pytest.raises(UserError, match=r"model\.path: "):
        open_plan(compose_cfg(_args(other, data, out)), out, divisor)
    assert "hashed" not in caplog.text
    assert json.loads((out / "run.json").read_text()) == run
