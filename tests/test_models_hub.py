"""`model.path=org/name` from the local Hugging Face cache (offline) and `model.scheduler`.

The cache is a real huggingface_hub cache layout the test builds (models--org--name/refs/main and
snapshots/<commit>/ holding a tiny SANA pipeline saved by diffusers), read by huggingface_hub's own
snapshot_download(local_files_only=True); the scheduler swap is diffusers' from_config, and the
images are denoised by the real pipeline.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from jobs.errors import UserError
from jobs.models.registry import get_family
from jobs.plan.identity import run_identity
from jobs.preflight import check_config
from tests.helpers import compose_cfg
from tests.test_models_checkpoint import _request

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REAL = ["model=sana", "model.dtype=float32", "model.complex_human_instruction=null"]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    cfg = compose_cfg(["output_dir=/tmp/x"])
    fam = get_family("sana")
    pipe = fam.build_tiny(cfg.model, torch.float32)
    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo = cache / "models--bcgen-test--sana-tiny"
    pipe.save_pretrained(repo / "snapshots" / COMMIT, safe_serialization=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cfg, fam, pipe, cache


def test_a_hub_id_loads_the_cached_snapshot_offline(hub_cache, tmp_path, monkeypatch):
    tiny_cfg, fam, pipe, cache = hub_cache
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cfg = compose_cfg([*REAL, "model.path=bcgen-test/sana-tiny", f"output_dir={tmp_path / 'o'}"])
    check_config(cfg)
    assert cfg.model.path == str(cache / "models--bcgen-test--sana-tiny" / "snapshots" / COMMIT)
    assert run_identity(cfg, "d", 1)["model"]["path"].endswith(COMMIT)  # another revision: another run
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # diffusers' torch_dtype deprecation is a FutureWarning
        loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    pipe.set_progress_bar_config(disable=True)
    assert (fam.denoise_decode(pipe, _request(fam, pipe, tiny_cfg))
            == fam.denoise_decode(loaded, _request(fam, loaded, cfg))).all()


def test_a_hub_id_missing_from_the_cache_says_how_to_get_it(hub_cache, tmp_path, monkeypatch):
    _, _, _, cache = hub_cache
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cfg = compose_cfg([*REAL, "model.path=bcgen-test/not-there", f"output_dir={tmp_path / 'o'}"])
    with pytest.raises(UserError, match=r"model.path='bcgen-test/not-there' is not a folder here.*"
                                        r"`hf download bcgen-test/not-there`"):
        check_config(cfg)


def test_model_scheduler_swaps_diffusers_scheduler_and_enters_the_identity(hub_cache, tmp_path, monkeypatch):
    tiny_cfg, fam, pipe, cache = hub_cache
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    base = [*REAL, "model.path=bcgen-test/sana-tiny", f"output_dir={tmp_path / 'o'}"]
    cfg = compose_cfg([*base, "model.scheduler=DPMSolverMultistepScheduler"])
    check_config(cfg)
    swapped = fam.load(cfg.model, torch.float32)
    swapped.set_progress_bar_config(disable=True)
    assert type(swapped.scheduler).__name__ == "DPMSolverMultistepScheduler"
    own_cfg = compose_cfg(base)
    check_config(own_cfg)
    own = fam.load(own_cfg.model, torch.float32)
    own.set_progress_bar_config(disable=True)
    a = fam.denoise_decode(own, _request(fam, own, tiny_cfg))
    b = fam.denoise_decode(swapped, _request(fam, swapped, cfg))
    assert not (a == b).all()  # the scheduler really denoised
    ident = run_identity(cfg, "d", 1)["model"]
    assert ident["scheduler"] == "DPMSolverMultistepScheduler"  # absent for the checkpoint's own (older runs resume)
    assert "scheduler" not in run_identity(own_cfg, "d", 1)["model"]


def test_an_unknown_scheduler_names_the_nearest(tmp_path):
    cfg = compose_cfg(["model.scheduler=DPMSolverMultistep", f"output_dir={tmp_path / 'o'}"])
    with pytest.raises(UserError, match="did you mean DPMSolverMultistepScheduler"):
        check_config(cfg)
