"""The demo world and its model: drawing, classifier, phrasings, text encoding, shipped weights."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from jobs.demo import captions as C
from jobs.demo import prompt_set
from jobs.demo.classify import classify
from jobs.demo.scenes import COLOR_NAMES, SHAPES, Labels, render, resolve
from jobs.errors import UserError
from tests.helpers import compose_cfg


def drawn(labels, side=128, seed=0):
    layout = resolve(torch.tensor([lab.as_indices() for lab in labels]), torch.Generator().manual_seed(seed))
    images = (render(layout, side).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    return layout, images


@pytest.mark.parametrize("side", [128, 96])
def test_classifier_reads_every_drawn_scene(side):
    rng = random.Random(side)
    labels = [C.random_labels(rng, p_size=1.0, p_position=0.8) for _ in range(48)]
    labels += [Labels(shape=s, color=c, background=b, size="small", h="left", v="top")
               for s, (c, b) in zip(SHAPES, [("orange", "yellow"), ("yellow", "orange"), ("red", "orange"), ("white", "yellow")])]
    layout, images = drawn(labels, side)
    for i, image in enumerate(images):
        r = classify(image)
        want = (SHAPES[layout.shape[i]], COLOR_NAMES[layout.color[i]], COLOR_NAMES[layout.background[i]])
        assert (r.shape, r.color, r.background) == want, (i, r)


def test_classifier_says_none_on_a_blank_image():
    r = classify(np.full((128, 128, 3), (37, 84, 220), dtype=np.uint8))
    assert (r.background, r.color, r.shape) == ("blue", None, None)


def test_layout_follows_the_labels():
    labels = [Labels(shape="star", color="red", background="blue", size="large", h="right", v="bottom")] * 16
    layout, _ = drawn(labels)
    assert (layout.shape == SHAPES.index("star")).all() and (layout.color == 0).all() and (layout.background == 2).all()
    assert (layout.cx > 0.5).all() and (layout.cy > 0.5).all() and (layout.r >= 0.25).all()
    open_ = resolve(torch.full((256, 6), -1), torch.Generator().manual_seed(1))
    assert (open_.color != open_.background).all()  # open colours never clash


def test_heldout_phrasings_are_disjoint_from_training():
    assert not set(C.TRAIN_TEMPLATES) & set(C.HELDOUT_TEMPLATES)
    assert not set(C.TRAIN_FILLER) & set(C.HELDOUT_FILLER)
    trained = {c for c, _ in C.train_pool(random.Random(0), 20000)}
    bundled = [r for r in prompt_set.build_rows() if r["heldout"]]
    assert len(bundled) >= 450
    assert not trained & {r["prompt"] for r in bundled}


def test_bundled_rows_state_complete_scenes():
    rows = prompt_set.build_rows()
    heldout = [r for r in rows if r["heldout"]]
    assert all(r["labels"].shape and r["labels"].color and r["labels"].background for r in heldout)
    assert {r["labels"].shape for r in heldout} == set(SHAPES)
    assert {r["labels"].color for r in heldout} == set(COLOR_NAMES) == {r["labels"].background for r in heldout}
    for r in rows:  # a negative prompt never names the row's own shape or colours
        neg = r.get("negative_prompt", "")
        lab = r["labels"]
        assert not any(w and w in neg.split() for w in (lab.color, lab.background)), (r["prompt"], neg)


def test_training_text_is_the_pipelines_encoding():
    from diffusers import SanaPipeline

    from jobs.demo.text import encode, tokenize
    from jobs.models import text_encoders

    tok, enc = text_encoders.load_tokenizer("minilm"), text_encoders.load_text_encoder("minilm")
    prompts = ["A small RED star on a blue background", "", "star", C.with_filler(random.Random(0), "a red star",
                                                                                       C.TRAIN_FILLER, 120)]
    ids, mask = tokenize(tok, prompts)
    ours = encode(enc, ids, mask)
    pipe = SanaPipeline(tokenizer=tok, text_encoder=enc, transformer=None, vae=None, scheduler=None)
    theirs, their_mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, device="cpu",
                                                  max_sequence_length=300, complex_human_instruction=None)
    n = ids.shape[1]
    assert torch.equal(their_mask[:, :n], mask) and not their_mask[:, n:].any()
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[:, :n][real], rtol=1e-5, atol=1e-5)


# -- the shipped weights -----------------------------------------------------------------------
def test_trained_weights_load_exactly_and_differ_from_random():
    from safetensors.torch import load_file

    from jobs.models import demo_weights
    from tests.helpers import tiny_pipeline

    _, _, trained = tiny_pipeline("sana_tiny")
    _, _, again = tiny_pipeline("sana_tiny")
    _, _, rand = tiny_pipeline("sana_tiny", "model.tiny.weights=random")
    stored = load_file(str(demo_weights.DEMO_DIR / "transformer.safetensors"))
    assert all(v.dtype == torch.float16 for v in stored.values())
    state = trained.transformer.state_dict()
    assert all(torch.equal(state[k], v.float()) for k, v in stored.items())
    assert all(torch.equal(a, b) for a, b in zip(trained.vae.parameters(), again.vae.parameters()))
    assert not torch.equal(next(trained.transformer.parameters()), next(rand.transformer.parameters()))


def test_weights_choice_is_validated():
    with pytest.raises(UserError, match="model.tiny.weights='pretrained' is not allowed; choose one of: trained, random"):
        compose_cfg(["model.tiny.weights=pretrained"])


@pytest.mark.parametrize("override, message", [
    ("model.tiny.transformer.num_layers=2", "model.tiny.transformer.num_layers=2 .the trained weights have 4."),
    ("model.tiny.vae.scaling_factor=0.5", "model.tiny.vae.scaling_factor=0.5"),
])
def test_trained_weights_refuse_another_architecture(tmp_path, override, message):
    from jobs.preflight import check_config

    cfg = compose_cfg([override, f"output_dir={tmp_path}"])
    with pytest.raises(UserError, match=message):
        check_config(cfg)
    check_config(compose_cfg([override, "model.tiny.weights=random", f"output_dir={tmp_path}"]))  # any architecture


def test_a_misspelt_tiny_key_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(UserError, match="model.tiny.weigths is not a config key.*known keys under model.tiny: .*weights"):
        compose_cfg(["+model.tiny.weigths=random", f"output_dir={tmp_path}"])
    from jobs.config import TinyConfig
    from jobs.models.demo_weights import check_sana_tiny

    with pytest.raises(UserError, match="model.tiny.clip is not a key of a SANA tiny preset"):  # another family's
        check_sana_tiny(TinyConfig(weights="random", clip={"hidden_size": 8}))


def test_other_tiny_presets_have_no_trained_weights(tmp_path):
    from jobs.preflight import check_config

    with pytest.raises(UserError, match="flux_tiny has no trained weights"):
        check_config(compose_cfg(["model=flux_tiny", "model.tiny.weights=trained", f"output_dir={tmp_path}"]))


def test_run_identity_tells_trained_from_random():
    from jobs.plan.identity import run_identity

    trained = run_identity(compose_cfg(["output_dir=/tmp/x"]), "d", 1)["model"]
    rand = run_identity(compose_cfg(["output_dir=/tmp/x", "model.tiny.weights=random"]), "d", 1)["model"]
    assert len(trained["tiny_weights_sha256"]) == 64 and "tiny_weights_sha256" not in rand
    assert trained["tiny"]["weights"] == "trained" and rand["tiny"]["weights"] == "random"
