"""Z-Image: captions keep their native length. Padding would change the image (the learned pad tokens
are attended), the graph key sees the exact caption length, so the bucket is that length; the job's
storage padding never reaches the model; the real preset loads a saved diffusers folder.

Tolerances: the job's path hands the pipeline the very caption tensors the pipeline makes itself,
so the comparisons that must match are exact; those that must differ use a 1e-3 margin, far above
float32 rounding.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from bcg.signature import signature
from jobs.models.base import DenoiseRequest
from jobs.models.z_image import captions
from jobs.preflight import check_config
from padding import PaddingRefused, get_padder
from tests.helpers import compose_cfg, tiny_pipeline

SHORT, LONGER = "a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("z_image_tiny")


def encode(fam, pipe, cfg, prompts):
    with torch.no_grad():
        return fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)


def run(fam, pipe, pos, neg, guidance=4.0, seed=3, steps=2):
    return fam.denoise_decode(pipe, DenoiseRequest(positive=pos, negative=neg, seeds=[seed], height=64, width=64,
                                                   steps=steps, guidance_scale=guidance))


def test_source_facts_the_policy_rests_on(tiny):
    from diffusers.models.transformers import transformer_z_image

    assert transformer_z_image.SEQ_MULTI_OF == 32
    params = inspect.signature(type(tiny[2].transformer).forward).parameters
    # captions go in unpadded and with no text mask (image_noise_mask is the omni variant's)
    assert "cap_feats" in params and [p for p in params if "mask" in p] == ["image_noise_mask"]


def test_plan_lengths_match_the_pipeline(tiny):
    cfg, fam, pipe = tiny
    prompts = ["", SHORT, LONGER, "word " * 40]
    lengths = fam.text_lengths(fam.load_tokenizer(cfg.model), prompts, cfg.model, instruction=True)
    assert [n.used for n in lengths] == [encode(fam, pipe, cfg, [p]).length for p in prompts]
    padder = get_padder("z_image", buckets=cfg.text_buckets, native_length=512)
    assert [padder.bucket_for(n.used) for n in lengths] == [n.used for n in lengths]
    assert not padder.masks_padding


def transformer_key(fam, pipe, pos, neg=None):
    calls = []
    handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append((a, kw)), with_kwargs=True)
    try:
        run(fam, pipe, pos, neg, guidance=4.0 if neg is not None else 0.0, steps=1)
    finally:
        handle.remove()
    return signature(*calls[0])


def test_equal_lengths_share_a_graph_different_lengths_do_not(tiny):
    cfg, fam, pipe = tiny
    tok = fam.load_tokenizer(cfg.model)
    a, b, c = "a red fox", "a blue owl", "a red fox in deep snow"
    la, lb, lc = (n.used for n in fam.text_lengths(tok, [a, b, c], cfg.model, True))
    assert la == lb != lc and -(-la // 32) == -(-lc // 32)  # c is longer but pads to the same 32-multiple
    neg = encode(fam, pipe, cfg, [""])
    ka, kb, kc = (transformer_key(fam, pipe, encode(fam, pipe, cfg, [p]), neg) for p in (a, b, c))
    assert ka == kb  # one graph for equal native lengths
    assert ka != kc  # the transformer's input is the unpadded caption: a 32-multiple bucket would miss


def test_padding_would_change_the_output(tiny):
    # What a bucket padder would do: append rows to the caption (here up to the next multiple of 32,
    # where the model itself would put cap_pad_token). The appended rows are attended.
    cfg, fam, pipe = tiny
    cap = captions(encode(fam, pipe, cfg, [SHORT]))[0]
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(4, 1, 16, 16, generator=g)]
    t = torch.full((1,), 0.5)
    grow = -len(cap) % 32 or 32
    padded = torch.cat([cap, torch.zeros(grow, cap.shape[1])])
    repeated = torch.cat([cap, cap[-1:].repeat(grow, 1)])  # even the rows diffusers itself pads with

    def out(c):
        with torch.no_grad():
            return pipe.transformer(x, t, [c], return_dict=False)[0][0]

    base = out(cap)
    assert torch.equal(base, out(cap))
    assert (out(padded) - base).abs().max().item() > 1e-3
    assert (out(repeated) - base).abs().max().item() > 1e-3


def test_padder_keeps_native_captions_and_refuses_to_cut(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("z_image", buckets=cfg.text_buckets, native_length=512)
    text = encode(fam, pipe, cfg, [SHORT, LONGER])  # rows of two native lengths
    for bucket in (text.length, text.length + 7):
        padded = padder.pad(text, bucket)
        assert padded.length == bucket
        assert all(torch.equal(p, n) for p, n in zip(captions(padded), captions(text)))
    with pytest.raises(PaddingRefused, match="cut real caption tokens"):
        padder.pad(text, text.used_length() - 1)


def test_job_path_equals_the_stock_pipeline_with_cfg(tiny):
    # The engine pads the (shorter) negative to the positive's bucket; the model must still get the
    # pipeline's own captions: the image equals ZImagePipeline(prompt=..., negative_prompt=...).
    cfg, fam, pipe = tiny
    padder = get_padder("z_image", buckets=cfg.text_buckets, native_length=512)
    pos, neg = encode(fam, pipe, cfg, [LONGER]), encode(fam, pipe, cfg, [""])
    assert neg.length < pos.length
    ours = run(fam, pipe, padder.pad(pos, pos.length), padder.pad(neg, pos.length))
    stock = pipe(prompt=[LONGER], negative_prompt=[""], guidance_scale=4.0, num_inference_steps=2, height=64,
                 width=64, generator=[torch.Generator().manual_seed(3)], output_type="np", return_dict=False)[0]
    assert (ours == stock).all()


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "z_image_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=z_image", f"model.path={path}", "model.dtype=float32", "output_dir=/tmp/x"])
    check_config(cfg)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 8
    assert torch.equal(loaded.transformer.cap_pad_token, pipe.transformer.cap_pad_token)

    def image(p, c):
        return run(fam, p, encode(fam, p, c, ["a castle in the clouds"]), encode(fam, p, c, [""]), seed=5)

    assert (image(pipe, tiny_cfg) == image(loaded, cfg)).all()
