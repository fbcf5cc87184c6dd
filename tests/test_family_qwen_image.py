"""Qwen-Image: bucket padding (embeddings, mask, text RoPE) leaves the output unchanged; one bucket is
one graph signature; the real preset loads a saved diffusers folder.

Tolerance: the joint attention turns mask 0 into a boolean SDPA mask, so padded keys get a weight
of exactly 0 and the real tokens keep their rotary positions (text RoPE is sliced from the padded
length, starting at the same offset). What can change is the reduction order inside the attention
kernel when the key length changes, so the bound is float32 rounding: 1e-5 absolute on outputs of
unit scale (measured: 3.6e-7 on the transformer, 3.0e-7 on images in [0, 1]).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from bcg.signature import signature
from jobs.models.base import DenoiseRequest
from jobs.models.qwen_image import PROMPT_TEMPLATE, TEMPLATE_DROP, TOKENIZER_MAX
from jobs.preflight import check_config
from padding import TextEmbeds, get_padder
from tests.helpers import compose_cfg, tiny_pipeline

TOL = 1e-5
SHORT, LONGER = "a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("qwen_image_tiny")


def encode(fam, pipe, cfg, prompts):
    with torch.no_grad():
        return fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)


def test_plan_constants_and_host_inputs_match_installed_diffusers(tiny):
    _, _, pipe = tiny
    assert pipe.prompt_template_encode == PROMPT_TEMPLATE
    assert pipe.prompt_template_encode_start_idx == TEMPLATE_DROP
    assert pipe.tokenizer_max_length == TOKENIZER_MAX
    # diffusers 0.42 dropped `txt_seq_lens`: text RoPE follows the embeddings' length. If a host text
    # length comes back, the padder must set it to the bucket (padding/qwen_image.py).
    params = inspect.signature(type(pipe.transformer).forward).parameters
    assert "txt_seq_lens" not in params and "encoder_hidden_states_mask" in params


def test_plan_lengths_match_the_pipeline(tiny):
    cfg, fam, pipe = tiny
    prompts = ["", SHORT, LONGER, "word " * 40]
    lengths = fam.text_lengths(fam.load_tokenizer(cfg.model), prompts, cfg.model, instruction=True)
    assert [n.used for n in lengths] == [encode(fam, pipe, cfg, [p]).length for p in prompts]


def test_padder_buckets():
    p = get_padder("qwen_image", buckets=[64, 128, 256, 512, 1024], native_length=512)
    assert [p.bucket_for(n) for n in (1, 64, 65, 300, 512)] == [64, 64, 128, 512, 512]
    assert p.masks_padding


def transformer_calls(pipe):
    """Record the kwargs of every transformer call (after keep_text_mask has run)."""
    calls = []
    handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append(dict(kw)), with_kwargs=True)
    return calls, handle


def run(fam, pipe, pos, neg, seed=3, steps=2):
    return fam.denoise_decode(pipe, DenoiseRequest(positive=pos, negative=neg, seeds=[seed], height=64, width=64,
                                                   steps=steps, guidance_scale=4.0))


def test_two_lengths_in_one_bucket_share_a_graph_signature(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("qwen_image", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    short, longer = fam.text_lengths(fam.load_tokenizer(cfg.model), [SHORT, LONGER], cfg.model, True)
    assert short.used != longer.used
    bucket = padder.bucket_for(short.used)
    assert bucket == padder.bucket_for(longer.used) == 64
    neg = padder.pad(encode(fam, pipe, cfg, [""]), bucket)
    keys = []
    for prompt in (SHORT, LONGER):
        calls, handle = transformer_calls(pipe)
        try:
            run(fam, pipe, padder.pad(encode(fam, pipe, cfg, [prompt]), bucket), neg, steps=1)
        finally:
            handle.remove()
        keys.append([signature((), kw) for kw in calls])
    assert len(keys[0]) == 2 and keys[0] == keys[1]  # cond + uncond calls, identical keys


def test_a_prompt_that_fills_its_bucket_keeps_the_same_signature(tiny):
    # encode_prompt drops an all-ones mask to None; keep_text_mask restores it, or this bucket would
    # get a second graph.
    cfg, fam, pipe = tiny
    full = encode(fam, pipe, cfg, [LONGER])
    assert bool(full.mask.all())
    short = get_padder("qwen_image", buckets=[full.length], native_length=512).pad(
        encode(fam, pipe, cfg, [SHORT]), full.length)
    keys = []
    for text in (full, short):
        calls, handle = transformer_calls(pipe)
        try:
            run(fam, pipe, text, None, steps=1)
        finally:
            handle.remove()
        assert calls[0]["encoder_hidden_states_mask"] is not None
        keys.append(signature((), calls[0]))
    assert keys[0] == keys[1]


def forward(pipe, text: TextEmbeds, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = text.embeds.shape[0]
    x = torch.randn(b, 64, 16, generator=g)  # 8x8 packed latent tokens of a 64x64 image
    with torch.no_grad():
        return pipe.transformer(hidden_states=x, encoder_hidden_states=text.embeds,
                                encoder_hidden_states_mask=text.mask, timestep=torch.full((b,), 0.5),
                                img_shapes=[[(1, 8, 8)]] * b, return_dict=False)[0]


@pytest.mark.parametrize("bucket", [64, 128, 512])
def test_padded_text_gives_the_native_transformer_output(tiny, bucket):
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, [SHORT, LONGER])  # right-padded to the longer prompt, as diffusers does
    padded = get_padder("qwen_image", buckets=[64, 128, 512], native_length=512).pad(native, bucket)
    assert padded.length == bucket and padded.mask.shape == (2, bucket)
    diff = (forward(pipe, padded) - forward(pipe, native)).abs().max().item()
    assert diff <= TOL, f"bucket {bucket}: max abs diff {diff}"


def test_unmasked_padding_would_change_the_output(tiny):
    # The mask is what makes padding safe: the same padded text with its mask set to 1 differs.
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, [SHORT])
    padded = get_padder("qwen_image", buckets=[64], native_length=512).pad(native, 64)
    unmasked = padded.with_length(padded.embeds, torch.ones_like(padded.mask))
    assert (forward(pipe, unmasked) - forward(pipe, native)).abs().max().item() > 1e-3


def test_whole_pipeline_image_unchanged_by_bucketing(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("qwen_image", buckets=[64], native_length=512)
    pos, neg = encode(fam, pipe, cfg, ["a blue bird on a branch"]), encode(fam, pipe, cfg, [""])
    native = run(fam, pipe, pos, neg)
    bucketed = run(fam, pipe, padder.pad(pos, 64), padder.pad(neg, 64))
    assert abs(native - bucketed).max() <= TOL


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "qwen_image_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=qwen_image", f"model.path={path}", "model.dtype=float32", "output_dir=/tmp/x"])
    check_config(cfg)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 8
    tok = fam.load_tokenizer(cfg.model)
    assert fam.text_lengths(tok, [LONGER], cfg.model, True) == fam.text_lengths(
        fam.load_tokenizer(tiny_cfg.model), [LONGER], tiny_cfg.model, True)

    def image(p, c):
        return run(fam, p, encode(fam, p, c, ["a castle in the clouds"]), encode(fam, p, c, [""]), seed=5)

    assert (image(pipe, tiny_cfg) == image(loaded, cfg)).all()


def test_capturable_text_lengths_match_diffusers():
    # The shim differs from diffusers only in how it makes the fallback length (a device fill instead
    # of a host-to-device copy that CUDA graph capture forbids); every output must be identical.
    from jobs.models.qwen_image import _text_seq_len_from_mask, capturable_text_lengths

    capturable_text_lengths()
    original = _text_seq_len_from_mask.replaced
    assert "as_tensor" in inspect.getsource(original)  # drop the shim once diffusers stops copying
    g = torch.Generator().manual_seed(0)
    text = torch.randn(4, 12, 8, generator=g)
    mask = torch.rand(4, 12, generator=g) > 0.5
    mask[2] = False  # no real token: the fallback length
    for m in (mask, mask.long(), None):
        a, b = original(text, m), _text_seq_len_from_mask(text, m)
        assert a[0] == b[0]
        for x, y in zip(a[1:], b[1:]):
            assert (x is None and y is None) or torch.equal(x, y)
