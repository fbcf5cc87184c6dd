"""`model.loras`: a LoRA this test makes with peft, fused through diffusers' own loaders."""

from __future__ import annotations

import pytest
import torch

from jobs.errors import UserError
from jobs.models.base import DenoiseRequest
from jobs.models.lora import lora_identity
from jobs.models.registry import get_family
from jobs.plan.identity import run_identity
from jobs.preflight import check_config
from tests.helpers import compose_cfg, tiny_pipeline

SCALE = 0.7


def make_lora(preset: str, folder, *overrides: str):
    """A rank-4 LoRA on a tiny preset's transformer attention, random (non-zero) B matrices, saved
    by the pipeline class's own `save_lora_weights`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model_state_dict

    _, _, pipe = tiny_pipeline(preset, *overrides)
    torch.manual_seed(1)
    pipe.transformer.add_adapter(PeftLoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                                target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    type(pipe).save_lora_weights(folder, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer))
    return folder / "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory):
    return make_lora("sana_tiny", tmp_path_factory.mktemp("lora"))


def with_lora(path, scale=SCALE) -> str:
    return f"model.loras=[{{path:'{path}',scale:{scale}}}]"


def image(fam, pipe, cfg):
    with torch.no_grad():
        text = fam.encode(pipe, ["a castle in the clouds"], cfg.model, "cpu", instruction=True)
    return fam.denoise_decode(pipe, DenoiseRequest(positive=text, negative=None, seeds=[5], height=64, width=64,
                                                   steps=2, guidance_scale=1.0))


def lora_layers(pipe) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [n for n, m in pipe.transformer.named_modules() if isinstance(m, BaseTunerLayer)]


def test_a_lora_changes_the_images_as_diffusers_fusing_it_by_hand_does(lora_file):
    cfg, fam, plain = tiny_pipeline("sana_tiny")
    _, _, fused = tiny_pipeline("sana_tiny", with_lora(lora_file))
    assert lora_layers(fused) == [] and fused.get_list_adapters() == {}  # fused, adapter modules gone
    ours = image(fam, fused, cfg)
    assert abs(ours - image(fam, plain, cfg)).max() > 1e-3

    _, _, by_hand = tiny_pipeline("sana_tiny")
    by_hand.load_lora_weights(str(lora_file))
    by_hand.fuse_lora(lora_scale=SCALE)
    by_hand.unload_lora_weights()
    assert (ours == image(fam, by_hand, cfg)).all()

    # The scale means what it means for a live adapter; fusing only rounds once more.
    _, _, adapter = tiny_pipeline("sana_tiny")
    adapter.load_lora_weights(str(lora_file), adapter_name="a")
    adapter.set_adapters(["a"], [SCALE])
    assert abs(ours - image(fam, adapter, cfg)).max() < 1e-5


def test_a_loaded_checkpoint_gets_the_same_lora(lora_file, tmp_path):
    cfg, fam, tiny = tiny_pipeline("sana_tiny", with_lora(lora_file))
    _, _, plain = tiny_pipeline("sana_tiny")
    plain.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    real = compose_cfg(["model=sana", f"model.path={tmp_path / 'ckpt'}", "model.dtype=float32",
                        "model.complex_human_instruction=null", "output_dir=/tmp/x", with_lora(lora_file)])
    loaded = fam.load(real.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert lora_layers(loaded) == []
    assert (image(fam, loaded, real) == image(fam, tiny, cfg)).all()


def test_a_bad_lora_fails_before_the_model_loads(tmp_path):
    from safetensors.torch import save_file

    missing = tmp_path / "nope.safetensors"
    with pytest.raises(ValueError, match=r"model.loras\[0\].path='.*nope.safetensors' does not exist"):
        check_config(compose_cfg(["output_dir=/tmp/x", with_lora(missing)]))
    # Through the loader too, before it reads model.path (which does not exist either).
    real = compose_cfg(["model=sana", f"model.path={tmp_path / 'no_ckpt'}", "output_dir=/tmp/x", with_lora(missing)])
    with pytest.raises(ValueError, match="does not exist or is not a file"):
        get_family("sana").load(real.model, torch.float32)

    pickled = tmp_path / "lora.bin"
    pickled.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="safetensors only"):
        check_config(compose_cfg(["output_dir=/tmp/x", with_lora(pickled)]))
    not_lora = tmp_path / "model.safetensors"
    save_file({"transformer.proj.weight": torch.zeros(2, 2)}, str(not_lora))
    with pytest.raises(ValueError, match="holds no LoRA weights"):
        check_config(compose_cfg(["output_dir=/tmp/x", with_lora(not_lora)]))


def test_a_pipeline_without_lora_loaders_refuses_loras(lora_file):
    with pytest.raises(ValueError, match="LongCatImagePipeline has no LoRA loader"):
        check_config(compose_cfg(["model=longcat_image_tiny", "output_dir=/tmp/x", with_lora(lora_file)]))


def test_loras_are_part_of_the_run_identity(lora_file, tmp_path):
    def identity(*overrides):
        return run_identity(compose_cfg(["output_dir=/tmp/x", *overrides]), "digest", 3)

    assert "loras" not in identity()["model"]  # run.json files written before LoRAs still match
    one = identity(with_lora(lora_file))
    assert [(d["path"], d["scale"]) for d in one["model"]["loras"]] == [(str(lora_file), SCALE)]
    assert one != identity(with_lora(lora_file, 0.5))
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(lora_file.read_bytes())
    before = lora_identity(compose_cfg(["output_dir=/tmp/x", with_lora(copy)]).model.loras)
    copy.write_bytes(lora_file.read_bytes()[:-4] + b"\0\0\0\0")  # retrained under the same name
    assert lora_identity(compose_cfg(["output_dir=/tmp/x", with_lora(copy)]).model.loras) != before


def renamed(lora_file, out, rename) -> tuple:
    """A copy of `lora_file` with `rename(i, key)` applied to each key: (its path, the keys renamed)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(lora_file))
    moved = {k: rename(i, k) for i, k in enumerate(tensors)}
    save_file({moved[k]: v for k, v in tensors.items()}, str(out))
    return out, sorted(new for k, new in moved.items() if new != k), len(tensors)


def partly_renamed(lora_file, out) -> tuple:
    """Every third tensor's key names a module this transformer lacks (`attn1` -> `attn9`)."""
    return renamed(lora_file, out, lambda i, k: k.replace(".attn1.", ".attn9.") if i % 3 == 0 else k)


def test_a_lora_that_matches_the_model_only_in_part_is_refused_before_it_is_fused(lora_file, tmp_path):
    partial, moved, total = partly_renamed(lora_file, tmp_path / "partial.safetensors")
    assert 0 < len(moved) < total
    with pytest.raises(UserError) as e:
        tiny_pipeline("sana_tiny", with_lora(partial))
    message = str(e.value)
    assert message.startswith(f"model.loras[0].path='{partial}': {len(moved)} of its {total} LoRA tensors match no "
                              f"layer of SanaPipeline's transformer ({total - len(moved)} do), e.g. {moved[0]!r}, "
                              f"{moved[1]!r}, {moved[2]!r}; fused, the LoRA would apply in part"), message
    assert "for another model, or its keys are in a format diffusers does not convert" in message

    # A LoRA saved for another component (here `unet.`) reaches nothing: refused, not a traceback from fuse_lora.
    other, moved, total = renamed(lora_file, tmp_path / "unet.safetensors",
                                  lambda i, k: "unet." + k.removeprefix("transformer."))
    with pytest.raises(UserError, match=f"{total} of its {total} LoRA tensors match no layer .* \\(0 do\\).* "
                                        f"would apply not at all"):
        tiny_pipeline("sana_tiny", with_lora(other))


def test_a_lora_for_the_transformer_and_the_text_encoder_reaches_both(tmp_path):
    """Flux loads LoRAs into its text encoder too: a LoRA with layers in both is whole, and loads."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model_state_dict, inject_adapter_in_model

    _, _, pipe = tiny_pipeline("flux_tiny")
    torch.manual_seed(1)
    adapter = dict(r=4, lora_alpha=4, init_lora_weights=False)
    inject_adapter_in_model(PeftLoraConfig(target_modules=["to_q"], **adapter), pipe.transformer)
    inject_adapter_in_model(PeftLoraConfig(target_modules=["q_proj"], **adapter), pipe.text_encoder)
    type(pipe).save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer),
                                 text_encoder_lora_layers=get_peft_model_state_dict(pipe.text_encoder))
    both = tmp_path / "pytorch_lora_weights.safetensors"
    _, _, fused = tiny_pipeline("flux_tiny", with_lora(both))
    assert fused.get_list_adapters() == {}


@pytest.mark.slow
def test_a_job_refuses_a_partial_lora_before_it_claims_output_dir(lora_file, tmp_path):
    """With model.path, the transformer's weight names (their headers) settle it in the config check: the job
    exits 2 with the message, output_dir is never claimed, and the whole LoRA then runs there."""
    from tests.test_exit_paths import refused
    from tests.test_resume_kill import FAST, cli, log_of

    _, _, plain = tiny_pipeline("sana_tiny")
    plain.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    partial, moved, total = partly_renamed(lora_file, tmp_path / "partial.safetensors")
    out = tmp_path / "out"
    args = ["model=sana", f"model.path={tmp_path / 'ckpt'}", "model.complex_human_instruction=null",
            "dataset.limit=2", f"output_dir={out}", *FAST]
    text = refused(*args, with_lora(partial))
    assert f"{len(moved)} of its {total} LoRA tensors match no layer of SanaPipeline's transformer" in text
    assert not out.exists()
    proc = cli(*args, with_lora(lora_file))
    assert proc.returncode == 0, log_of(proc)
