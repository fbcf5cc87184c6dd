"""LTX-2: what the pipeline does to the text (left-pad to 1024; the connectors turn the padding into
attended registers, all positions unmasked), why that makes padding change the output (so the
padder refuses it), the frame and frame-rate rules, the staged decode (video and sound) equal to
the pipeline's own, the real preset loading a saved folder, and graph replay on the CPU op tape.

Pass-through hands the pipeline the very tensors it would make, so the comparisons that must match
are exact; the ones that must differ are checked against a margin (1e-4) far above float32 rounding
of these unit-scale outputs (~1e-7).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from bcg.signature import signature
from jobs.dataset import DatasetError
from jobs.errors import UserError
from jobs.worker.outputs import on_device
from jobs.models.base import DenoiseRequest
from jobs.worker.pixels import to_uint8
from jobs.plan.build import plan_dataset
from jobs.preflight import check_config
from padding import PaddingRefused, TextEmbeds, get_padder
from tests.helpers import compose_cfg, prompts, tiny_pipeline, write_jsonl

SHORT, LONGER = "a red fox", "a lighthouse on a cliff at dusk, waves crashing below, oil painting"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("ltx2_tiny")


def encode(fam, pipe, cfg, prompts_, **kw):
    with torch.no_grad():
        if kw:  # another text length, straight from the pipeline
            embeds, mask, _, _ = pipe.encode_prompt(prompts_, do_classifier_free_guidance=False, device="cpu", **kw)
            return TextEmbeds(embeds=embeds, mask=mask)
        return fam.encode(pipe, prompts_, cfg.model, "cpu", instruction=True)


def request(pos, neg=None, seeds=(3,), frames=5, steps=2, guidance=3.0, fps=24.0):
    return DenoiseRequest(positive=pos, negative=neg, seeds=list(seeds), height=64, width=64, steps=steps,
                          guidance_scale=guidance if neg is not None else 1.0, num_frames=frames, fps=fps)


def connect(pipe, text: TextEmbeds):
    with torch.no_grad():
        return pipe.connectors(text.embeds, text.mask, padding_side=pipe.tokenizer.padding_side)


def forward(pipe, text: TextEmbeds, seed=0):
    """One transformer call as the pipeline makes it (connectors first), 2 latent frames of 64x64."""
    video_text, audio_text, mask = connect(pipe, text)
    g = torch.Generator().manual_seed(seed)
    x, a = torch.randn(1, 2 * 8 * 8, 8, generator=g), torch.randn(1, 4, 4, generator=g)
    t = torch.full((1,), 500.0)
    with torch.no_grad():
        return pipe.transformer(hidden_states=x, audio_hidden_states=a, encoder_hidden_states=video_text,
                                audio_encoder_hidden_states=audio_text, timestep=t, sigma=t,
                                encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=2,
                                height=8, width=8, fps=24.0, audio_num_frames=4, return_dict=False)


def test_the_text_is_left_padded_and_the_connectors_unmask_registers(tiny):
    cfg, fam, pipe = tiny
    text = encode(fam, pipe, cfg, [SHORT, LONGER])
    assert text.length == 1024 and pipe.tokenizer.padding_side == "left"
    used = text.mask.sum(1)
    assert used[0] < used[1] < 64 and not text.mask[:, :900].any() and text.mask[:, -int(used[0]):].all()
    video_text, audio_text, mask = connect(pipe, text)
    # every pad position is now a register, and the transformer's text mask is all ones
    assert pipe.connectors.video_connector.num_learnable_registers == 128
    assert mask.shape == (2, 1024) and bool(mask.all())
    assert (video_text[:, -1].abs().sum(-1) > 0).all()  # the last position held a pad token: now a register
    assert "encoder_attention_mask" in inspect.signature(type(pipe.transformer).forward).parameters


def test_every_prompt_gets_the_fixed_length_bucket(tiny):
    cfg, fam, pipe = tiny
    padder = get_padder("ltx2", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    assert not padder.masks_padding
    lengths = fam.text_lengths(fam.load_tokenizer(cfg.model), [SHORT, f"  {LONGER} ", "word " * 1100], cfg.model,
                               True)
    assert lengths[0].used < lengths[1].used < lengths[2].used == 1024 and lengths[2].truncated
    assert {padder.bucket_for(n.used) for n in lengths} == {1024}
    # the plan's count equals the real tokens the pipeline's tokenizer marks (prompts stripped, as it does)
    assert [n.used for n in lengths[:2]] == [int(encode(fam, pipe, cfg, [p]).mask.sum()) for p in (SHORT, LONGER)]


def test_padding_would_change_the_output_and_is_refused(tiny):
    cfg, fam, pipe = tiny
    native = encode(fam, pipe, cfg, [SHORT])
    base_video, base_audio = forward(pipe, native)
    again = forward(pipe, native)
    assert torch.equal(base_video, again[0]) and torch.equal(base_audio, again[1])  # the comparison is deterministic
    # 128 more left-pad positions (the next length the connectors accept): 128 more attended registers
    grown = encode(fam, pipe, cfg, [SHORT], max_sequence_length=1152)
    assert grown.length == 1152 and torch.equal(grown.mask.sum(1), native.mask.sum(1))
    video, audio = forward(pipe, grown)
    assert (video - base_video).abs().max().item() > 1e-4 and (audio - base_audio).abs().max().item() > 1e-4
    padder = get_padder("ltx2", buckets=[64, 1024], native_length=1024)
    assert padder.pad(native, 1024) is native
    for bucket in (64, 1152):
        with pytest.raises(PaddingRefused, match="register"):
            padder.pad(native, bucket)


def test_two_lengths_share_graph_signatures(tiny):
    """With CFG the pipeline makes three transformer calls a step (CFG, spatio-temporal guidance,
    modality isolation): three signatures, the same for a short and a long prompt."""
    cfg, fam, pipe = tiny
    neg = encode(fam, pipe, cfg, [""])
    keys = []
    for prompt in (SHORT, LONGER):
        calls = []
        handle = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: calls.append(kw), with_kwargs=True)
        try:
            fam.denoise_decode(pipe, request(encode(fam, pipe, cfg, [prompt]), neg, steps=1))
        finally:
            handle.remove()
        keys.append([signature((), kw) for kw in calls])
    assert len(keys[0]) == len(set(keys[0])) == 3 and keys[0] == keys[1]


def test_staged_decode_gives_the_pipelines_video_and_sound(tiny):
    cfg, fam, pipe = tiny
    pos, neg = encode(fam, pipe, cfg, [SHORT, LONGER]), encode(fam, pipe, cfg, ["", ""])
    req = request(pos, neg, seeds=(1, 2), frames=9)
    with torch.no_grad():
        video, audio = pipe(**fam.pipeline_kwargs(req), output_type="np", return_dict=False)
        staged = on_device(fam.decode(pipe, fam.denoise(pipe, req), req), [])
    assert staged.pixels.shape == (2, 9, 64, 64, 3) and staged.finite.all()
    assert np.array_equal(staged.pixels.numpy(), to_uint8(np.asarray(video, dtype=np.float32)))
    # sound: [B, C, N] from the vocoder -> [B, N, C] for the wav, same values
    assert staged.sample_rate == 24000 and audio.shape[:2] == (2, 2)
    assert torch.equal(staged.audio, audio.float().transpose(1, 2).clamp(-1, 1))
    # ~ the clip's duration (9 frames at 24 fps), less what the causal audio VAE keeps back
    assert 0.8 * 9 / 24 * 24000 < audio.shape[2] <= 9 / 24 * 24000
    # CFG, the seed and the frame rate reach the output
    plain = to_uint8(fam.denoise_decode(pipe, request(pos, None, seeds=(1, 2), frames=9)))
    slower = to_uint8(fam.denoise_decode(pipe, request(pos, neg, seeds=(1, 2), frames=9, fps=12.0)))
    serial = to_uint8(fam.denoise_decode(pipe, req))
    assert np.array_equal(serial, staged.pixels.numpy())
    assert not np.array_equal(plain, serial) and not np.array_equal(slower, serial)
    assert not np.array_equal(serial[0], serial[1])


def test_vae_ratios_follow_the_class(tiny):
    from jobs.models.ltx2 import vae_ratios

    cfg, fam, pipe = tiny
    assert vae_ratios(dict(pipe.vae.config)) == (pipe.vae.spatial_compression_ratio,
                                                 pipe.vae.temporal_compression_ratio) == (8, 4)
    assert vae_ratios({}) == (64, 16)  # the class defaults (released configs set the ratios explicitly)
    assert vae_ratios({"spatial_compression_ratio": 32, "temporal_compression_ratio": 8}) == (32, 8)


def test_frame_and_rate_rules(tiny, tmp_path):
    cfg, fam, _ = tiny
    assert [fam.frames_error(cfg.model, n) for n in (1, 5, 9)] == [None, None, None]
    assert fam.spatial_divisor(cfg.model) == 32
    with pytest.raises(UserError, match=r"sampling.num_frames=10, but LTX2Pipeline makes 4k\+1 frames.*use 9 or 13"):
        check_config(compose_cfg(["model=ltx2_tiny", "sampling.num_frames=10", f"output_dir={tmp_path / 'o'}"]))
    rows = prompts(4)
    rows[1]["fps"] = 24  # the job's rate: fine
    rows[2]["fps"] = 30
    rows[3]["num_frames"] = 6
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    plan_cfg = compose_cfg(["model=ltx2_tiny", f"dataset.path={data}", f"output_dir={tmp_path / 'o'}"])
    with pytest.raises(DatasetError) as err:
        plan_dataset(plan_cfg, fam.spatial_divisor(plan_cfg.model), tmp_path / "w")
    msg = str(err.value)
    assert "p.jsonl:3: fps=30, but LTX2Pipeline conditions on the frame rate" in msg
    assert "sampling.fps=30" in msg and "p.jsonl:4: num_frames=6" in msg and "p.jsonl:2" not in msg


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "ltx2_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=ltx2", f"model.path={path}", "model.dtype=float32", f"output_dir={tmp_path / 'o'}"])
    check_config(cfg)
    assert (cfg.sampling.num_frames, cfg.sampling.fps, cfg.sampling.height, cfg.sampling.width) == (121, 24.0, 512, 768)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded.transformer) is type(pipe.transformer) and type(loaded.vocoder) is type(pipe.vocoder)
    assert loaded.tokenizer.padding_side == "left"
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model)
    assert fam.frames_error(cfg.model, 8) == fam.frames_error(tiny_cfg.model, 8)

    def outputs(p, c):
        req = request(encode(fam, p, c, ["a castle in the clouds"]), encode(fam, p, c, [""]), steps=1)
        with torch.no_grad():
            return on_device(fam.decode(p, fam.denoise(p, req), req), [])

    a, b = outputs(pipe, tiny_cfg), outputs(loaded, cfg)
    assert torch.equal(a.pixels, b.pixels) and torch.equal(a.audio, b.audio)


def test_graph_replay_equals_eager_on_the_cpu_op_tape():
    """The GPU test's check (tests/gpu/test_family_graphs_gpu.py) on bcg's CPU op tape: every
    transformer call of two prompts with CFG (three signatures a step) replays to the eager bytes,
    video and sound. The GPU run proves the same with CUDA graphs."""
    from tests.gpu.test_family_graphs_gpu import check_family

    stats = check_family("ltx2", "cpu", "tape")
    assert stats["captures"] == 3 and stats["misses"] == 0 and stats["hits"] > 0
