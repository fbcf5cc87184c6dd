"""Wan 2.1/2.2: what the pipeline does to the text (trim to the prompt, re-pad with zero rows to
512, no mask), why that makes padding change the video (so the padder refuses it), the frame
rule, the staged decode equal to the pipeline's own, and the real preset loading a saved folder.

Pass-through hands the transformer the very tensors the pipeline made, so the comparisons that
must match are exact; the ones that must differ are checked against a margin (1e-3) far above
float32 rounding.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

from bcg.signature import signature
from jobs.dataset import DatasetError
from jobs.errors import UserError
from jobs.models.base import DenoiseRequest
from jobs.worker.pixels import to_uint8, to_uint8_torch
from jobs.plan.build import plan_dataset
from jobs.preflight import check_config
from padding import PaddingRefused, TextEmbeds, get_padder
from tests.helpers import compose_cfg, prompts, tiny_pipeline, write_jsonl

SHORT, LONGER = "a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("wan_tiny")


def encode(fam, pipe, cfg, prompts_):
    with torch.no_grad():
        return fam.encode(pipe, prompts_, cfg.model, "cpu", instruction=True)


def request(text, neg=None, seed=3, frames=5, steps=2, guidance=5.0):
    return DenoiseRequest(positive=text, negative=neg, seeds=[seed], height=64, width=64, steps=steps,
                          guidance_scale=guidance if neg is not None else 1.0, num_frames=frames)


def test_the_pipeline_pads_with_zero_rows_and_the_transformer_takes_no_mask(tiny):
    cfg, fam, pipe = tiny
    params = inspect.signature(type(pipe.transformer).forward).parameters
    assert not [p for p in params if "mask" in p]  # if diffusers adds one, this padder can bucket
    text = encode(fam, pipe, cfg, [SHORT, LONGER])
    assert text.length == 512
    for row in range(2):
        used = int(text.mask[row].sum())
        assert used == text.used_length() if row == 1 else used < text.used_length()
        assert (text.embeds[row, used:] == 0).all()  # trimmed, re-padded with zeros
        assert (text.embeds[row, :used].abs().sum(-1) > 0).all()
    # ... and the zero rows are not inert: the text projection makes them one non-zero vector
    with torch.no_grad():
        projected = pipe.transformer.condition_embedder.text_embedder(text.embeds[:1])
    assert projected[0, -1].abs().max() > 1e-3 and torch.equal(projected[0, -1], projected[0, -2])


def test_prompt_clean_is_the_pipelines():
    from diffusers.pipelines.wan import pipeline_wan

    from jobs.models.wan import prompt_clean

    texts = ["", "  a  red\tfox\n", "fish &amp;amp; chips", "caf\u00e9 &lt;b&gt;", "\u00e2\u20ac\u0153quoted\u00e2\u20ac\u009d",
             "line\r\nbreak\u3000wide space", "x" * 50]
    assert [prompt_clean(t) for t in texts] == [pipeline_wan.prompt_clean(t) for t in texts]


def test_every_prompt_gets_the_fixed_length_bucket(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("wan", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    assert not padder.masks_padding
    lengths = fam.text_lengths(fam.load_tokenizer(cfg.model), [SHORT, LONGER, "word " * 600], cfg.model, True)
    assert lengths[0].used < lengths[1].used < lengths[2].used == 512 and lengths[2].truncated
    assert {padder.bucket_for(n.used) for n in lengths} == {512}
    # the plan's count equals the real tokens the pipeline's tokenizer marks
    assert [n.used for n in lengths[:2]] == [encode(fam, pipe, cfg, [p]).used_length() for p in (SHORT, LONGER)]


def forward(pipe, text: TextEmbeds, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, 2, 8, 8, generator=g)  # 2 latent frames of a 64x64 clip
    with torch.no_grad():
        return pipe.transformer(hidden_states=x, timestep=torch.full((1,), 500.0), encoder_hidden_states=text.embeds,
                                return_dict=False)[0]


def test_padding_would_change_the_output_and_is_refused(tiny):
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, [SHORT])
    assert native.used_length() < 64
    base = forward(pipe, native)
    assert torch.equal(base, forward(pipe, native))  # the comparison itself is deterministic
    # What a bucket padder would do: cut the zero rows to 64, or add 128 more zero rows (masked or not,
    # the transformer never sees a mask).
    cut = native.with_length(native.embeds[:, :64], native.mask[:, :64])
    grown = native.with_length(torch.nn.functional.pad(native.embeds, (0, 0, 0, 128)),
                               torch.nn.functional.pad(native.mask, (0, 128)))
    assert (forward(pipe, cut) - base).abs().max().item() > 1e-3
    assert (forward(pipe, grown) - base).abs().max().item() > 1e-3
    padder = get_padder("wan", buckets=[64, 128, 512], native_length=512)
    assert padder.pad(native, 512) is native
    for bucket in (64, 640):
        with pytest.raises(PaddingRefused, match="no text mask"):
            padder.pad(native, bucket)


def test_two_lengths_share_a_graph_signature(tiny):
    cfg, fam, pipe = tiny
    keys = []
    for prompt in (SHORT, LONGER):
        calls = []
        handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append(kw), with_kwargs=True)
        try:
            fam.denoise_decode(pipe, request(encode(fam, pipe, cfg, [prompt]), steps=1))
        finally:
            handle.remove()
        keys.append(signature((), calls[0]))
    assert keys[0] == keys[1]


def test_staged_decode_gives_the_pipelines_bytes(tiny):
    """denoise -> decode (cached VAE statistics) -> uint8 on the device == the pipeline's own call."""
    cfg, fam, pipe = tiny
    pos, neg = encode(fam, pipe, cfg, [SHORT, LONGER]), encode(fam, pipe, cfg, ["", ""])
    req = DenoiseRequest(positive=pos, negative=neg, seeds=[1, 2], height=64, width=64, steps=2, guidance_scale=5.0,
                         num_frames=9)
    serial = to_uint8(fam.denoise_decode(pipe, req))
    with torch.no_grad():
        frames = fam.decode(pipe, fam.denoise(pipe, req), req)
        staged, finite = to_uint8_torch(frames)
    assert frames.shape == (2, 9, 3, 64, 64) and finite.all()
    assert serial.shape == (2, 9, 64, 64, 3) and np.array_equal(staged.numpy(), serial)
    # CFG and the seed reach the video
    other = to_uint8(fam.denoise_decode(pipe, DenoiseRequest(positive=pos, negative=None, seeds=[1, 2], height=64,
                                                             width=64, steps=2, guidance_scale=1.0, num_frames=9)))
    assert not np.array_equal(other, serial) and not np.array_equal(serial[0], serial[1])


def test_frame_counts_follow_the_vae(tiny, tmp_path):
    cfg, fam, _ = tiny
    assert [fam.frames_error(cfg.model, n) for n in (1, 5, 81)] == [None, None, None]
    assert fam.frames_error(cfg.model, 80) == ("num_frames=80, but WanPipeline makes 4k+1 frames (its VAE compresses "
                                               "time by 4); use 77 or 81")
    with pytest.raises(UserError, match=r"sampling.num_frames=10, but WanPipeline makes 4k\+1 frames.*use 9 or 13"):
        check_config(compose_cfg(["model=wan_tiny", "sampling.num_frames=10", f"output_dir={tmp_path / 'o'}"]))
    with pytest.raises(UserError, match="sampling.height=72 is not a multiple of 16"):
        check_config(compose_cfg(["model=wan_tiny", "sampling.height=72", f"output_dir={tmp_path / 'o'}"]))
    rows = prompts(3)
    rows[2]["num_frames"] = 6
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    plan_cfg = compose_cfg(["model=wan_tiny", f"dataset.path={data}", f"output_dir={tmp_path / 'o'}"])
    with pytest.raises(DatasetError, match=r"p.jsonl:3: num_frames=6, but WanPipeline makes 4k\+1 frames"):
        plan_dataset(plan_cfg, fam.spatial_divisor(plan_cfg.model), tmp_path / "w")


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "wan_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=wan", f"model.path={path}", "model.dtype=float32", f"output_dir={tmp_path / 'o'}"])
    check_config(cfg)
    assert (cfg.sampling.num_frames, cfg.sampling.fps, cfg.sampling.height, cfg.sampling.width) == (81, 16.0, 480, 832)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded.transformer) is type(pipe.transformer) and type(loaded.vae).__name__ == "AutoencoderKLWan"
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 16
    assert fam.frames_error(cfg.model, 80) == fam.frames_error(tiny_cfg.model, 80)

    def video(p, c):
        return fam.denoise_decode(p, request(encode(fam, p, c, ["a castle in the clouds"]), frames=5))

    assert (video(pipe, tiny_cfg) == video(loaded, cfg)).all()

    # A two-expert Wan 2.2 (A14B) checkpoint is refused before any weight loads.
    index = json.loads((path / "model_index.json").read_text())
    index["transformer_2"] = ["diffusers", "WanTransformer3DModel"]
    index["boundary_ratio"] = 0.875
    (path / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="two-expert Wan 2.2 checkpoint"):
        check_config(cfg)


def test_graph_replay_equals_eager_on_the_cpu_op_tape():
    """The GPU test's check (tests/gpu/test_family_graphs_gpu.py) on bcg's CPU op tape: every
    transformer call of two prompts, 9 frames with CFG, shares one captured signature and replays
    to the eager bytes. The GPU run proves the same with CUDA graphs."""
    from tests.gpu.test_family_graphs_gpu import check_family

    stats = check_family("wan", "cpu", "tape")
    assert stats["captures"] == 1 and stats["misses"] == 0 and stats["hits"] > 0
