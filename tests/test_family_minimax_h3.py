"""MiniMax-H3 (jobs/models/minimax_h3.py): the staged family gives the modular pipeline's own video and
sound bit for bit (same text embeddings and seed), the model's frame and size rules, the real preset
loading a saved folder, graph replay on the CPU op tape, and a job writing KEY.mp4 + KEY.wav.
"""

from __future__ import annotations

import io
import json
import wave

import pytest
import torch

from jobs.models.base import DenoiseRequest
from jobs.preflight import check_config
from tests.helpers import compose_cfg, tiny_pipeline, write_jsonl

FRAMES = 124  # 17k+5, the shortest clip (5.17 s at 24 fps)


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("minimax_h3_tiny")


def request(fam, pipe, cfg, prompts, seeds, steps=3):
    with torch.no_grad():
        text = fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)
    return DenoiseRequest(positive=text, negative=None, seeds=list(seeds), height=64, width=64, steps=steps,
                          guidance_scale=1.0, num_frames=FRAMES, fps=24, prompts=list(prompts))


def staged(fam, pipe, req):
    with torch.no_grad():
        return fam.decode(pipe, fam.denoise(pipe, req), req)


def test_the_staged_stages_are_the_modular_pipelines_bytes(tiny):
    """The modular pipeline's own t2va denoise and decode blocks (MiniMaxH3CoreDenoiseStep +
    MiniMaxH3DecodeStep) on the same components, embeddings and seed: equal video and sound."""
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (MiniMaxH3CoreDenoiseStep,
                                                                                    MiniMaxH3DecodeStep)

    cfg, fam, pipe = tiny
    blocks = SequentialPipelineBlocks.from_blocks_dict({"denoise": MiniMaxH3CoreDenoiseStep(),
                                                        "decode": MiniMaxH3DecodeStep()})
    ref = blocks.init_pipeline()
    ref.update_components(**{k: getattr(pipe, k) for k in ("transformer", "vae", "audio_vae", "scheduler",
                                                           "audio_scheduler")})
    ref.set_progress_bar_config(disable=True)
    req = request(fam, pipe, cfg, ["a red fox"], seeds=(7,))
    ours = staged(fam, pipe, req)
    with torch.no_grad():
        theirs = ref(prompt_embeds=req.positive.embeds, text_token_tags=torch.full((req.positive.length,), 1),
                     height=64, width=64, num_frames=FRAMES, num_inference_steps=3,
                     generator=torch.Generator().manual_seed(7), output_type="pt", output=["videos", "audio"])
    assert ours.images.shape == (1, FRAMES, 3, 64, 64) and ours.audio.shape == (1, 2, 165600)  # 5.17 s at 32 kHz
    assert torch.equal(ours.images, theirs["videos"]) and torch.equal(ours.audio, theirs["audio"])
    assert ours.sample_rate == 32000
    # another seed, another clip; a batch of two holds each row's own noise (equal up to batched kernels)
    pair = staged(fam, pipe, request(fam, pipe, cfg, ["a red fox", "a blue owl"], seeds=(7, 8)))
    assert (pair.images[0] - ours.images[0]).abs().max() < 1e-5 and (pair.images[1] - ours.images[0]).abs().max() > 1e-3


def test_text_is_the_prompt_verbatim_at_hidden_state_50(tiny):
    cfg, fam, pipe = tiny
    tok = fam.load_tokenizer(cfg.model)
    assert [n.used for n in fam.text_lengths(tok, ["a red fox", "a red fox in the snow"], cfg.model, True)] == [3, 6]
    text = request(fam, pipe, cfg, ["a red fox in the snow"], seeds=(1,)).positive
    ids = torch.tensor([tok("a red fox in the snow", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        hidden = pipe.text_encoder.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    assert pipe.text_encoder.config.text_config.num_hidden_layers == 51 and len(hidden) == 52
    assert torch.equal(text.embeds, hidden[50]) and not torch.equal(text.embeds, hidden[51])
    assert text.mask.tolist() == [[1] * 6]


def test_frames_sizes_and_the_padder(tiny):
    from padding import PaddingRefused, get_padder

    cfg, fam, _ = tiny
    assert fam.spatial_divisor(cfg.model) == 32
    assert fam.frames_error(cfg.model, 124) is None and fam.frames_error(cfg.model, 345) is None
    assert "use 124" in fam.frames_error(cfg.model, 9) and "use 141" in fam.frames_error(cfg.model, 140)
    assert "use 345" in fam.frames_error(cfg.model, 400)
    padder = get_padder("minimax_h3", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    assert padder.bucket_for(3) == 3
    with pytest.raises(PaddingRefused):
        padder.pad(request(fam, tiny[2], cfg, ["a red fox"], seeds=(1,)).positive, 64)


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "minimax_h3_tiny"
    fam.save(pipe, path)
    cfg = compose_cfg(["model=minimax_h3", f"model.path={path}", "model.dtype=float32", f"output_dir={tmp_path / 'o'}",
                       "sampling.height=64", "sampling.width=64"])
    check_config(cfg)
    loaded = fam.load(cfg.model, torch.float32)
    assert type(loaded.transformer) is type(pipe.transformer)
    assert fam.spatial_divisor(cfg.model) == 32 and fam.frames_error(cfg.model, 124) is None
    a = staged(fam, pipe, request(fam, pipe, tiny_cfg, ["a red fox"], seeds=(4,), steps=2))
    b = staged(fam, loaded, request(fam, loaded, cfg, ["a red fox"], seeds=(4,), steps=2))
    assert torch.equal(a.images, b.images) and torch.equal(a.audio, b.audio)


def test_bf16_tiny_keeps_float32_what_from_pretrained_keeps(tiny, tmp_path):
    """The bf16 tiny build's tensors are, dtype and value, the ones `from_pretrained(torch_dtype=bf16)`
    loads from a float32 save: the VAE's bare `scale1`/`scale2` parameters included, without which its
    float32 `norm_out` gets bf16 input (CUDA's LayerNorm refuses that; the CPU's does not), and the
    kept tensors at full float32 precision (not rounded to bf16 and back)."""
    from jobs.models.minimax_h3 import cast_keeping_fp32

    _, _, pipe = tiny
    for name in ("transformer", "vae", "audio_vae"):
        component = getattr(pipe, name)  # float32
        component.save_pretrained(tmp_path / name)
        want = type(component).from_pretrained(tmp_path / name, torch_dtype=torch.bfloat16)
        got = type(component).from_pretrained(tmp_path / name)  # the same float32 tensors (weight norm: no deepcopy)
        cast_keeping_fp32(got, torch.bfloat16)
        for (k, a), (k2, b) in zip(sorted(got.state_dict().items()), sorted(want.state_dict().items())):
            assert k == k2 and a.dtype == b.dtype and torch.equal(a, b), (name, k, a.dtype, b.dtype)
        for (k, a), (_, b) in zip(sorted(got.named_buffers()), sorted(want.named_buffers())):
            assert a.dtype == b.dtype, (name, k, a.dtype, b.dtype)  # non-persistent ones too
        kinds = {t.dtype for t in want.state_dict().values()}  # the audio VAE is kept all float32
        assert kinds == ({torch.float32} if name == "audio_vae" else {torch.float32, torch.bfloat16}), (name, kinds)


def test_graph_replay_equals_eager_on_the_cpu_op_tape():
    """The GPU test's check (tests/gpu/test_family_graphs_gpu.py) on bcg's CPU op tape: the per-row
    timestep plan reaches the transformer as device tensors, so every call after the two captures
    (one distinct timestep at the first step, two after) replays to the eager bytes."""
    from tests.gpu.test_family_graphs_gpu import check_family

    stats = check_family("minimax_h3", "cpu", "tape")
    assert stats["captures"] == 2 and stats["misses"] == 0 and stats["capture_failures"] == 0 and stats["hits"] > 0


def test_a_job_writes_the_clip_and_its_sound_and_resumes(tmp_path):
    import av
    import webdataset as wds

    from jobs.worker.run import run_job
    from tests.test_job_e2e import sha

    rows = [{"key": "fox", "prompt": "a red fox"}, {"key": "owl", "prompt": "a blue owl"},
            {"key": "sea", "prompt": "waves on a rocky shore", "num_frames": 141}]
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    args = ["model=minimax_h3_tiny", f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", "sampling.steps=2",
            "job.progress=false"]
    stats = run_job(compose_cfg(args))
    assert stats.status == "complete" and stats.kinds == {"video": 3}
    seen = {}
    for s in wds.WebDataset([str(p) for p in sorted((tmp_path / "out").glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(s["json"])
        with av.open(io.BytesIO(s["mp4"])) as c:
            n = sum(1 for _ in c.decode(video=0))
            rate = float(c.streams.video[0].average_rate)
        with wave.open(io.BytesIO(s["wav"])) as w:
            seconds, channels, hz = w.getnframes() / w.getframerate(), w.getnchannels(), w.getframerate()
        seen[meta["key"]] = (n, rate, round(seconds, 3), channels, hz, meta["bucket"])
    assert seen == {"fox": (124, 24.0, 5.175, 2, 32000, 3), "owl": (124, 24.0, 5.175, 2, 32000, 3),
                    "sea": (141, 24.0, 5.875, 2, 32000, 5)}
    before = {p.name: sha(p) for p in (tmp_path / "out").glob("shard-*.tar")}
    again = run_job(compose_cfg(args))
    assert again.items_written == 0 and {p.name: sha(p) for p in (tmp_path / "out").glob("shard-*.tar")} == before


def test_guidance_and_other_frame_rates_are_refused(tmp_path):
    """Guidance-distilled at a fixed 24 fps: the config check names the key and the fix; a dataset row
    asking for guidance is refused with its file:line, not silently run without it."""
    from jobs.errors import UserError
    from jobs.worker.run import run_job

    base = ["model=minimax_h3_tiny", f"output_dir={tmp_path / 'o'}"]
    with pytest.raises(UserError, match=r"sampling.guidance_scale=4.5, but minimax_h3_tiny is guidance-distilled"):
        check_config(compose_cfg([*base, "sampling.guidance_scale=4.5"]))
    with pytest.raises(UserError, match=r"sampling.fps=16, but MiniMaxH3ModularPipeline makes 24 fps only"):
        check_config(compose_cfg([*base, "sampling.fps=16"]))
    with pytest.raises(UserError, match=r"sampling.num_frames=81, .* use 124"):
        check_config(compose_cfg([*base, "sampling.num_frames=81"]))
    data = write_jsonl(tmp_path / "p.jsonl", [{"key": "a", "prompt": "a red fox", "guidance_scale": 3.0}])
    with pytest.raises(UserError, match=r"p.jsonl:1.*guidance_scale=3, but minimax_h3_tiny is guidance-distilled"):
        run_job(compose_cfg([*base, f"dataset.path={data}", "job.progress=false"]))


def test_fewer_steps_than_its_scheduler_takes_are_refused(tmp_path):
    """MiniMaxH3Scheduler.set_timesteps refuses 1 step: the config check says so before a model loads,
    and a dataset row asking for 1 step is refused with its file:line, not crashed on mid-job."""
    from jobs.errors import UserError
    from jobs.worker.run import run_job

    base = ["model=minimax_h3_tiny", f"output_dir={tmp_path / 'o'}"]
    with pytest.raises(UserError, match=r"sampling.steps=1, but minimax_h3_tiny's scheduler takes at least 2 steps"):
        check_config(compose_cfg([*base, "sampling.steps=1"]))
    data = write_jsonl(tmp_path / "p.jsonl", [{"key": "a", "prompt": "a red fox"},
                                              {"key": "b", "prompt": "a blue owl", "steps": 1}])
    with pytest.raises(UserError, match=r"p.jsonl:2.*steps=1, but minimax_h3_tiny's scheduler takes at least 2"):
        run_job(compose_cfg([*base, f"dataset.path={data}", "sampling.steps=2", "job.progress=false"]))


def test_batch_sizing_probes_at_the_steps_its_scheduler_takes(tiny):
    """Batch sizing times a probe batch at n and n + 2 steps (after a warm call at n + 1), n being the
    family's fewest: 2 here (at 1 the scheduler raised, which ended the H200 job test of session 21)."""
    from jobs.worker.batch_sizer import PipelineProber
    from jobs.worker.pipeline import Pipeline
    from jobs.plan import Item, Signature
    from padding import get_padder

    cfg, fam, pipe = tiny
    padder = get_padder("minimax_h3", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    sig = Signature(height=64, width=64, text_bucket=3, steps=4, guidance_scale=1.0, cfg=False,
                    dtype=cfg.model.dtype, frames=FRAMES)
    items = [Item(key="fox", prompt="a red fox", negative_prompt="", seed=1, signature=sig, text_tokens=3,
                  truncated=False, source="t:1", fps=24.0)]
    prober = PipelineProber(engine, items, sig)
    assert prober.first == fam.min_steps == 2
    probe = prober(1)
    assert probe is not None and probe.batch == 1  # times are not asserted: timing is the benchmarks' job
