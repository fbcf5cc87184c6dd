"""`model.max_sequence_length` against what the text encoder and the pipeline can take: refused with the
config checks (ModelFamily.text_length_limit and text_length_multiple, jobs/preflight.py), before any
weight loads, from the checkpoint's configs. Each limit is shown to be the real one: a long prompt runs
at it, and fails past it."""

from __future__ import annotations

import json

import pytest
import torch

from jobs.errors import UserError
from jobs.models.base import DenoiseRequest
from jobs.models.text_encoders import minilm_path
from jobs.preflight import check_config
from tests.helpers import compose_cfg, tiny_pipeline

LONG = " ".join(["red"] * 1100)  # more tokens than any limit below, with any of the tokenizers


def refusal(*overrides: str) -> str:
    with pytest.raises(UserError) as e:
        check_config(compose_cfg([*overrides, "output_dir=/tmp/x"]))
    return str(e.value)


def accepted(*overrides: str) -> None:
    check_config(compose_cfg([*overrides, "output_dir=/tmp/x"]))


def encode_long(preset: str, max_sequence_length: int, *overrides: str, instruction: bool = False):
    cfg, fam, pipe = tiny_pipeline(preset, *overrides)
    cfg.model.max_sequence_length = max_sequence_length  # past the config check: what the pipeline does with it
    with torch.no_grad():
        return fam, pipe, fam.encode(pipe, [LONG], cfg.model, "cpu", instruction=instruction)


def saved(tmp_path_factory, preset: str, name: str):
    """The tiny preset's pipeline saved as a diffusers folder, as a checkpoint is loaded through the real preset."""
    _, _, pipe = tiny_pipeline(preset)
    path = tmp_path_factory.mktemp("ckpt") / name
    pipe.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def sana_checkpoint(tmp_path_factory):
    """sana_tiny saved: its text encoder is MiniLM (BERT, 512 learned positions)."""
    return saved(tmp_path_factory, "sana_tiny", "sana")


def test_an_encoder_with_learned_positions_takes_no_more_than_it_has(sana_checkpoint):
    encode_long("sana_tiny", 512)
    with pytest.raises(RuntimeError, match="must match the existing size \\(512\\)"):
        encode_long("sana_tiny", 513)  # what the job met after the model had loaded

    assert refusal("model.max_sequence_length=513") == (
        f"model.max_sequence_length=513, but sana_tiny's text encoder ({minilm_path()}/config.json) has 512 learned "
        f"positions; set model.max_sequence_length=512 or less")
    accepted("model.max_sequence_length=512")

    # A checkpoint: its text_encoder/config.json says so, read without loading a weight.
    real = ["model=sana", f"model.path={sana_checkpoint}", "model.complex_human_instruction=null"]
    assert json.loads((sana_checkpoint / "text_encoder" / "config.json").read_text())["max_position_embeddings"] == 512
    assert refusal(*real, "model.max_sequence_length=600") == (
        f"model.max_sequence_length=600, but sana's text encoder ({sana_checkpoint}/text_encoder/config.json) has "
        f"512 learned positions; set model.max_sequence_length=512 or less")
    accepted(*real, "model.max_sequence_length=512")


def test_the_instruction_prefix_takes_its_share_of_the_positions(sana_checkpoint):
    cfg = compose_cfg(["model=sana", f"model.path={sana_checkpoint}", "output_dir=/tmp/x"])
    chi = cfg.model.complex_human_instruction
    from jobs.models.text_encoders import load_tokenizer

    most = 512 - (len(load_tokenizer("minilm").encode("\n".join(chi))) - 2)
    overrides = ("model.complex_human_instruction=" + json.dumps(list(chi)),)
    encode_long("sana_tiny", most, *overrides, instruction=True)
    with pytest.raises(RuntimeError, match="must match the existing size"):
        encode_long("sana_tiny", most + 1, *overrides, instruction=True)

    real = ["model=sana", f"model.path={sana_checkpoint}"]  # the preset's own instruction prefix
    message = refusal(*real, f"model.max_sequence_length={most + 1}")
    assert message.endswith(f"has 512 learned positions, and model.complex_human_instruction takes {512 - most} of "
                            f"them; set model.max_sequence_length={most} or less"), message
    accepted(*real, f"model.max_sequence_length={most}")


def test_the_pipelines_own_caps():
    with pytest.raises(ValueError, match="cannot be greater than 512"):  # FluxPipeline.check_inputs, after the load
        flux_call("flux_tiny", 513)
    assert refusal("model=flux_tiny", "model.max_sequence_length=513") == (
        "model.max_sequence_length=513, but FluxPipeline takes at most 512 T5 text positions (its check_inputs "
        "refuses more, once the model has loaded); set model.max_sequence_length=512 or less")
    accepted("model=flux_tiny", "model.max_sequence_length=512")

    assert refusal("model=qwen_image_tiny", "model.max_sequence_length=1025").startswith(
        "model.max_sequence_length=1025, but QwenImagePipeline encodes at most 1024 prompt tokens")
    accepted("model=qwen_image_tiny", "model.max_sequence_length=1024")


def flux_call(preset: str, length: int):
    fam, pipe, text = encode_long(preset, length)
    return fam.denoise_decode(pipe, DenoiseRequest(positive=text, negative=None, seeds=[1], height=64, width=64,
                                                   steps=1, guidance_scale=3.5))


@pytest.fixture(scope="module")
def z_image_checkpoint(tmp_path_factory):
    """z_image_tiny saved: its transformer's rope table has axes_lens[0] = 1024 rows."""
    return saved(tmp_path_factory, "z_image_tiny", "z_image")


def test_z_image_captions_fit_the_transformers_rope_table(z_image_checkpoint):
    def image(length):
        fam, pipe, text = encode_long("z_image_tiny", length)
        return fam.denoise_decode(pipe, DenoiseRequest(positive=text, negative=None, seeds=[1], height=64,
                                                       width=64, steps=1, guidance_scale=1.0))

    image(992)
    with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 1024"):
        image(993)

    # The constants the check uses where a config leaves axes_lens out are the installed diffusers' own.
    import inspect

    from diffusers.models.transformers import transformer_z_image

    from jobs.models import z_image
    assert z_image.SEQ_MULTI_OF == transformer_z_image.SEQ_MULTI_OF
    default = inspect.signature(transformer_z_image.ZImageTransformer2DModel.__init__).parameters["axes_lens"].default
    assert tuple(default) == z_image.AXES_LENS

    real = ["model=z_image", f"model.path={z_image_checkpoint}"]
    assert json.loads((z_image_checkpoint / "transformer" / "config.json").read_text())["axes_lens"][0] == 1024
    assert refusal(*real, "model.max_sequence_length=993").endswith(
        "(the transformer's axes_lens[0]), and a caption padded to a multiple of 32 plus the image's first position "
        "must fit in them: at most 992 caption tokens; set model.max_sequence_length=992 or less")
    accepted(*real, "model.max_sequence_length=992")


@pytest.mark.parametrize("preset", ["sana_video_tiny", "wan_tiny"])
def test_relative_and_rotary_positions_have_no_limit(preset):
    """Gemma-2 (SANA-Video) is rotary, UMT5 (Wan) relative: longer than max_position_embeddings (512 in the
    tiny Gemma-2's config) still runs, so nothing is refused."""
    _, _, text = encode_long(preset, 1100)
    assert text.embeds.shape[1] == 1100
    accepted(f"model={preset}", "model.max_sequence_length=1100")


def test_ltx2_lengths_are_multiples_of_its_connector_registers(tmp_path_factory):
    """LTX-2's text connectors tile their 128 learned registers over the padded prompt: the pipeline met a
    length of 1000 inside its first call, after the load; the config check refuses it before, with the two
    nearest lengths that run."""
    fam, pipe, text = encode_long("ltx2_tiny", 1000)
    assert text.embeds.shape[1] == 1000
    with pytest.raises(ValueError, match="should be divisible by the number of learnable registers 128"):
        pipe.connectors(text.embeds, text.mask)
    fam, pipe, text = encode_long("ltx2_tiny", 896)
    assert pipe.connectors(text.embeds, text.mask)[0].shape[1] == 896

    why = ("LTX-2's text connectors tile 128 learned registers over the padded prompt (connectors' "
           "*_num_learnable_registers), so it must be a multiple of 128")
    assert refusal("model=ltx2_tiny", "model.max_sequence_length=1000") == (
        f"model.max_sequence_length=1000, but {why}; set model.max_sequence_length=896 or 1024")
    assert refusal("model=ltx2_tiny", "model.max_sequence_length=100").endswith("set model.max_sequence_length=128")
    accepted("model=ltx2_tiny", "model.max_sequence_length=896")

    # A checkpoint's connectors/config.json is read (no weight loads): here its registers are 64 and 128.
    path = saved(tmp_path_factory, "ltx2_tiny", "ltx2")
    conf = path / "connectors" / "config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "video_connector_num_learnable_registers": 64}))
    real = ["model=ltx2", f"model.path={path}"]
    assert "must be a multiple of 128; set model.max_sequence_length=128 or 256" in refusal(
        *real, "model.max_sequence_length=192")
    accepted(*real, "model.max_sequence_length=256")
