"""SANA-Video: its 300-long Gemma text is masked in the transformer, so bucket padding gives the
native output (padded == native, here and through the whole pipeline); the plan's text lengths
equal what the pipeline encodes; the frame rule; the staged decode equal to the pipeline's own;
the real preset loading a saved folder.

Tolerance, as for SANA (tests/test_padding_sana.py): masked keys get weight exactly 0, but the
attention kernel's reduction order may change with the key length, so padded == native holds to
float32 rounding, 1e-5 on unit-scale outputs. Everything else is compared exactly.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from bcg.signature import signature
from jobs.errors import UserError
from jobs.models.base import DenoiseRequest
from jobs.worker.pixels import to_uint8, to_uint8_torch
from jobs.preflight import check_config
from padding import TextEmbeds, get_padder
from padding.bucket import BucketPadder
from tests.helpers import compose_cfg, tiny_pipeline

TOL = 1e-5
PROMPTS = ["a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("sana_video_tiny")


def encode(fam, pipe, cfg, prompts, instruction=True):
    with torch.no_grad():
        return fam.encode(pipe, prompts, cfg.model, "cpu", instruction=instruction)


def forward(pipe, text: TextEmbeds, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = text.embeds.shape[0]
    x = torch.randn(b, 16, 2, 8, 8, generator=g)  # 2 latent frames of a 64x64 clip
    with torch.no_grad():
        return pipe.transformer(x, encoder_hidden_states=text.embeds, encoder_attention_mask=text.mask,
                                timestep=torch.full((b,), 500.0), return_dict=False)[0]


def test_the_transformer_masks_the_text_and_the_padder_buckets_it():
    from diffusers import SanaVideoTransformer3DModel

    assert "encoder_attention_mask" in inspect.signature(SanaVideoTransformer3DModel.forward).parameters
    p = get_padder("sana_video", buckets=[64, 128, 256, 512, 1024], native_length=300)
    assert p.masks_padding and p.buckets == [64, 128, 256, 300]
    assert [p.bucket_for(n) for n in (1, 64, 65, 257, 300)] == [64, 64, 128, 300, 300]


@pytest.mark.parametrize("bucket", [64, 128, 300, 512])
def test_rebucketed_text_gives_the_native_output(tiny, bucket):
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, PROMPTS)
    assert native.length == 300 and native.used_length() < 64
    padder = get_padder("sana_video", buckets=[64, 128, 256], native_length=300)
    # the padder never grows past 300 on its own; grow by hand to show zero rows under mask 0 are inert too
    padded = padder.pad(native, bucket) if bucket <= 300 else BucketPadder([bucket], bucket + 1).pad(native, bucket)
    assert padded.length == bucket
    base = forward(pipe, native)
    diff = (forward(pipe, padded) - base).abs().max().item()
    assert diff <= TOL, f"bucket {bucket}: max abs diff {diff}"
    # the mask is what makes the tail inert: the same cut without it changes the output
    unmasked = padded.with_length(padded.embeds, torch.ones_like(padded.mask))
    assert (forward(pipe, unmasked) - base).abs().max().item() > 1e-3


def test_whole_pipeline_video_unchanged_by_bucketing(tiny):
    cfg, fam, pipe = tiny
    pos, neg = encode(fam, pipe, cfg, ["a blue bird on a branch"]), encode(fam, pipe, cfg, [""], instruction=False)
    padder = get_padder("sana_video", buckets=[64], native_length=300)

    def video(p, n):
        return fam.denoise_decode(pipe, DenoiseRequest(positive=p, negative=n, seeds=[3], height=64, width=64, steps=3,
                                                       guidance_scale=6.0, num_frames=5))

    native = video(pos, neg)
    assert native.shape == (1, 5, 64, 64, 3)
    assert abs(native - video(padder.pad(pos, 64), padder.pad(neg, 64))).max() <= TOL


def test_two_lengths_in_one_bucket_share_a_graph_signature(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("sana_video", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    keys = []
    for prompt in PROMPTS:
        calls = []
        handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append((a, kw)), with_kwargs=True)
        try:
            text = padder.pad(encode(fam, pipe, cfg, [prompt]), 64)
            fam.denoise_decode(pipe, DenoiseRequest(positive=text, negative=None, seeds=[1], height=64, width=64,
                                                    steps=1, guidance_scale=1.0, num_frames=5))
        finally:
            handle.remove()
        keys.append(signature(*calls[0]))
    assert keys[0] == keys[1]


@pytest.mark.parametrize("chi", [None, ["Describe the video in detail:", "User Prompt: "]])
def test_plan_lengths_match_what_the_pipeline_encodes(chi):
    overrides = ["model.max_sequence_length=48"]
    if chi:
        overrides.append("model.complex_human_instruction=[" + ",".join(f"'{c}'" for c in chi) + "]")
    cfg, fam, pipe = tiny_pipeline("sana_video_tiny", *overrides)
    tok = fam.load_tokenizer(cfg.model)
    prompts = ["", "cat", "A Red Fox in the snow", "word " * 20, "a very long prompt " * 30]
    planned = fam.text_lengths(tok, prompts, cfg.model, instruction=True)
    for p, length in zip(prompts, planned):
        enc = encode(fam, pipe, cfg, [p])
        assert enc.length == 48 and length.used == enc.used_length(), (p[:30], length, enc.used_length())
    assert planned[-1].truncated and not planned[1].truncated


def test_staged_decode_gives_the_pipelines_bytes(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("sana_video", buckets=cfg.text_buckets, native_length=300)
    pos = padder.pad(encode(fam, pipe, cfg, PROMPTS), 64)
    neg = padder.pad(encode(fam, pipe, cfg, ["", ""], instruction=False), 64)
    req = DenoiseRequest(positive=pos, negative=neg, seeds=[1, 2], height=64, width=64, steps=2, guidance_scale=6.0,
                         num_frames=9)
    serial = to_uint8(fam.denoise_decode(pipe, req))
    with torch.no_grad():
        frames = fam.decode(pipe, fam.denoise(pipe, req), req)
        staged, finite = to_uint8_torch(frames)
    assert frames.shape == (2, 9, 3, 64, 64) and finite.all()
    assert np.array_equal(staged.numpy(), serial)


def test_frames_and_sizes(tiny, tmp_path):
    cfg, fam, _ = tiny
    assert fam.spatial_divisor(cfg.model) == 32
    assert fam.frames_error(cfg.model, 9) is None
    assert "SanaVideoPipeline makes 4k+1 frames" in fam.frames_error(cfg.model, 8)
    with pytest.raises(UserError, match="sampling.width=48 is not a multiple of 32"):
        check_config(compose_cfg(["model=sana_video_tiny", "sampling.width=48", f"output_dir={tmp_path / 'o'}"]))


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    from diffusers import SanaVideoPipeline

    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "sana_video_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=sana_video", f"model.path={path}", "model.dtype=float32", f"output_dir={tmp_path / 'o'}"])
    check_config(cfg)
    # the preset's instruction prefix is the pipeline's own default
    default = inspect.signature(SanaVideoPipeline.__call__).parameters["complex_human_instruction"].default
    assert cfg.model.complex_human_instruction == default
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert fam.spatial_divisor(cfg.model) == 32 and fam.frames_error(cfg.model, 81) is None

    def video(p):  # the tiny preset's encoding (no instruction) on both, so only the weights differ
        text = encode(fam, p, tiny_cfg, ["a castle in the clouds"])
        return fam.denoise_decode(p, DenoiseRequest(positive=text, negative=None, seeds=[5], height=64, width=64,
                                                    steps=2, guidance_scale=1.0, num_frames=5))

    assert (video(pipe) == video(loaded)).all()


def test_graph_replay_equals_eager_on_the_cpu_op_tape():
    """The GPU test's check (tests/gpu/test_family_graphs_gpu.py) on bcg's CPU op tape: two prompts
    of one bucket, 9 frames with CFG, one captured signature, replay == eager bytes."""
    from tests.gpu.test_family_graphs_gpu import check_family

    stats = check_family("sana_video", "cpu", "tape")
    assert stats["captures"] == 1 and stats["misses"] == 0 and stats["hits"] > 0
