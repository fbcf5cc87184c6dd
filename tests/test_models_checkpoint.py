"""`model=sana model.path=DIR`: a real diffusers folder, saved by this test, loads offline and matches."""

from __future__ import annotations

import pytest
import torch

from jobs.models.base import DenoiseRequest
from jobs.models.registry import get_family
from jobs.preflight import check_config
from tests.helpers import compose_cfg


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cfg = compose_cfg(["output_dir=/tmp/x"])
    fam = get_family("sana")
    pipe = fam.build_tiny(cfg.model, torch.float32)
    path = tmp_path_factory.mktemp("ckpt") / "sana_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    return cfg, fam, pipe, path


def _request(fam, pipe, cfg):
    with torch.no_grad():
        pos = fam.encode(pipe, ["a castle in the clouds"], cfg.model, "cpu", instruction=True)
        neg = fam.encode(pipe, [""], cfg.model, "cpu", instruction=False)
    return DenoiseRequest(positive=pos, negative=neg, seeds=[5], height=64, width=64, steps=2, guidance_scale=4.5)


def test_real_preset_loads_saved_folder_and_matches(saved):
    tiny_cfg, fam, pipe, path = saved
    cfg = compose_cfg(["model=sana", f"model.path={path}", "model.dtype=float32",
                       "model.complex_human_instruction=null", "output_dir=/tmp/x"])
    check_config(cfg)  # folder checks pass
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    pipe.set_progress_bar_config(disable=True)
    a = fam.denoise_decode(pipe, _request(fam, pipe, tiny_cfg))
    b = fam.denoise_decode(loaded, _request(fam, loaded, cfg))
    assert (a == b).all()
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 32


def test_missing_path_is_named(tmp_path):
    cfg = compose_cfg(["model=sana", f"model.path={tmp_path / 'nope'}", "output_dir=/tmp/x"])
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        check_config(cfg)


def test_not_a_diffusers_folder_says_what_was_expected(tmp_path):
    cfg = compose_cfg(["model=sana", f"model.path={tmp_path}", "output_dir=/tmp/x"])
    with pytest.raises(ValueError) as e:
        check_config(cfg)
    assert "model_index.json is missing" in str(e.value) and "SanaPipeline" in str(e.value)


def test_pickle_only_weights_are_refused(saved, tmp_path):
    import shutil

    _, _, _, path = saved
    copy = tmp_path / "pickled"
    shutil.copytree(path, copy)
    for f in (copy / "transformer").glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    cfg = compose_cfg(["model=sana", f"model.path={copy}", "output_dir=/tmp/x"])
    with pytest.raises(ValueError, match="safetensors only"):
        check_config(cfg)


def test_model_path_required_for_real_preset():
    cfg = compose_cfg(["model=sana", "output_dir=/tmp/x"])
    with pytest.raises(ValueError, match="pass model.path=/local/diffusers/folder"):
        check_config(cfg)


@pytest.mark.parametrize("damage,message", [
    ("cut", r"transformer/diffusion_pytorch_model.safetensors: its tensors end at byte \d+, the file has \d+; the "
            r"file is damaged or was cut short"),
    ("gone", r"transformer: no weights \(\*.safetensors\) beside its config.json: the checkpoint is incomplete"),
    ("config", r"vae/config.json: cannot read it as JSON"),
    ("shard", r"diffusion_pytorch_model.safetensors.index.json maps weights to "
              r"diffusion_pytorch_model-00002-of-00002.safetensors, which is not in"),
])
def test_a_damaged_checkpoint_is_refused_before_anything_is_claimed(saved, tmp_path, damage, message):
    """A missing or truncated weight file, or a config that does not parse, was a traceback from the load after
    the job had claimed output_dir; the corrected rerun was then refused as another run."""
    import json
    import os
    import shutil

    _, _, _, path = saved
    copy = tmp_path / "damaged"
    shutil.copytree(path, copy)
    weights = copy / "transformer" / "diffusion_pytorch_model.safetensors"
    if damage == "cut":
        os.truncate(weights, weights.stat().st_size - 100)
    elif damage == "gone":
        weights.unlink()
    elif damage == "config":
        (copy / "vae" / "config.json").write_text('{"in_channels": 3,')
    else:  # a sharded checkpoint missing its second shard
        weights.rename(weights.with_name("diffusion_pytorch_model-00001-of-00002.safetensors"))
        index = {"metadata": {}, "weight_map": {"a.weight": "diffusion_pytorch_model-00001-of-00002.safetensors",
                                                "b.weight": "diffusion_pytorch_model-00002-of-00002.safetensors"}}
        (copy / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    out = tmp_path / "out"
    cfg = compose_cfg(["model=sana", f"model.path={copy}", f"output_dir={out}"])
    with pytest.raises(ValueError, match=message):
        check_config(cfg)
    assert not out.exists()
    if damage != "config":  # a plan reads configs and the tokenizer, no weights: jobs.plan may run without them
        check_config(compose_cfg(["model=sana", f"model.path={copy}", f"output_dir={out}"]), loads_weights=False)
