"""GLM-Image: the glyph text the DiT sees (its length counted as the pipeline counts it, left-padded
with attended zero rows in a batch: so the bucket is the native length), the prior (once per prompt,
seeded from the row, the same alone or in a batch, its digest in the json), the graph-friendly calls
(exactly the original forward), the staged decode equal to the pipeline's own, the real preset
loading a saved folder, and graph replay on the CPU op tape.

Everything that must match is compared exactly; what must differ is checked against a margin (1e-4)
far above float32 rounding of these unit-scale outputs.
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np
import pytest
import torch

from jobs.worker.outputs import on_device
from jobs.models.base import DenoiseRequest
from jobs.models.glm_image import capturable_forward, glyph_length, glyph_texts
from jobs.worker.pixels import to_uint8
from jobs.preflight import check_config
from padding import PaddingRefused, get_padder
from tests.helpers import compose_cfg, tiny_pipeline

PROMPTS = ["a red fox", "a sign that says 'OPEN' on a door", "two signs: 'A' and \"BB\"",
           "\u201cquoted\u201d, 「中文」 and 'x'", "it's a 'b' c'"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline("glm_image_tiny")


def encode(fam, pipe, cfg, prompts):
    with torch.no_grad():
        return fam.encode(pipe, prompts, cfg.model, "cpu", instruction=True)


def request(fam, pipe, cfg, prompts, seeds, cfg_on=True, steps=2):
    pos = encode(fam, pipe, cfg, prompts)
    neg = get_padder("glm_image", buckets=[1], native_length=2048).pad(encode(fam, pipe, cfg, [""] * len(prompts)),
                                                                       pos.length) if cfg_on else None
    return DenoiseRequest(positive=pos, negative=neg, seeds=list(seeds), height=64, width=64, steps=steps,
                          guidance_scale=1.5 if cfg_on else 1.0, prompts=list(prompts))


def dit(pipe, embeds, drop=False, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    b = embeds.shape[0]
    x = torch.randn(b, 4, 8, 8, generator=g)
    prior = torch.randint(0, 64, (b, 16), generator=g)
    with torch.no_grad():
        return pipe.transformer(hidden_states=x, encoder_hidden_states=embeds, prior_token_id=prior,
                                prior_token_drop=torch.full_like(prior, drop, dtype=torch.bool),
                                timestep=torch.full((b,), 500.0), target_size=torch.tensor([[64.0, 64.0]] * b),
                                crop_coords=torch.zeros(b, 2), return_dict=False, **kw)[0]


def test_glyph_texts_and_lengths_are_the_pipelines(tiny):
    from diffusers import GlmImagePipeline

    cfg, fam, pipe = tiny
    for p in PROMPTS:
        assert glyph_texts(p) == GlmImagePipeline.get_glyph_texts(None, p)[0]
    tok = fam.load_tokenizer(cfg.model)
    lengths = fam.text_lengths(tok, PROMPTS, cfg.model, True)
    with torch.no_grad():
        native = [pipe._get_glyph_embeds([p], 2048, "cpu").shape[1] for p in PROMPTS]
    assert [n.used for n in lengths] == native and native[0] == 1 and len(set(native)) == len(native)
    assert not any(n.truncated for n in lengths)
    assert glyph_length(tok, "'" + "y" * 40 + "'", 16) == (16, True)


def test_the_dit_attends_zero_rows_so_the_bucket_is_the_native_length(tiny):
    cfg, fam, pipe = tiny
    assert "attention_mask" not in inspect.getsource(type(pipe).__call__).split("noise_pred_cond = self.transformer(")[1]\
        .split(")[0]")[0]  # the pipeline passes the DiT no text mask
    text = encode(fam, pipe, cfg, [PROMPTS[1]])
    base = dit(pipe, text.embeds)
    assert torch.equal(base, dit(pipe, text.embeds))
    # what a batch with a longer prompt does to this one: 3 zero rows on the left
    padded = torch.nn.functional.pad(text.embeds, (0, 0, 3, 0))
    assert (dit(pipe, padded) - base).abs().max().item() > 1e-4
    # ... and the pipeline does it: a batch of two lengths left-pads the shorter
    mixed = encode(fam, pipe, cfg, [PROMPTS[0], PROMPTS[1]])
    assert mixed.embeds.shape[1] == 5 and (mixed.embeds[0, :4] == 0).all() and mixed.mask[0].tolist() == [0, 0, 0, 0, 1]
    padder = get_padder("glm_image", buckets=[64], native_length=2048)
    assert [padder.bucket_for(n) for n in (1, 5, 7)] == [1, 5, 7] and not padder.masks_padding
    assert padder.pad(text, 5) is text
    with pytest.raises(PaddingRefused):
        padder.pad(text, 3)
    # the unconditional side (never handed to the pipeline) may grow as storage, under mask 0
    neg = padder.pad(encode(fam, pipe, cfg, [""]), 5)
    assert neg.length == 5 and neg.mask.tolist() == [[1, 0, 0, 0, 0]]


def test_graph_friendly_calls_give_the_original_forward(tiny):
    """The rewritten forward (mask index -> where), the idle KV cache dropped and the rotary table
    passed in: bit for bit the installed forward, for kept and dropped prior tokens."""
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    cfg, fam, pipe = tiny
    tr = pipe.transformer
    base = type(tr).__mro__[1]
    original = base.forward
    assert type(tr).__name__ == base.__name__ == "GlmImageTransformer2DModel" and isinstance(tr, base)
    assert type(tr).forward.__code__.co_filename.startswith("<bcgen") and "where" in type(tr).forward.__code__.co_names
    assert "where" not in original.__code__.co_names and capturable_forward(base).__code__.co_names.count("where") == 1
    text = encode(fam, pipe, cfg, [PROMPTS[2], PROMPTS[2]])
    for drop in (False, True):
        patched = dit(pipe, text.embeds, drop=drop, kv_caches=GlmImageKVCache(num_layers=2))
        g = torch.Generator().manual_seed(0)
        x, prior = torch.randn(2, 4, 8, 8, generator=g), torch.randint(0, 64, (2, 16), generator=g)
        with torch.no_grad():
            ref = original(tr, hidden_states=x, encoder_hidden_states=text.embeds, prior_token_id=prior,
                           prior_token_drop=torch.full_like(prior, drop, dtype=torch.bool),
                           timestep=torch.full((2,), 500.0), target_size=torch.tensor([[64.0, 64.0]] * 2),
                           crop_coords=torch.zeros(2, 2), return_dict=False,
                           kv_caches=GlmImageKVCache(num_layers=2))[0]
        assert torch.equal(patched, ref), drop
    assert not torch.equal(dit(pipe, text.embeds, drop=True), dit(pipe, text.embeds, drop=False))


def test_the_prior_runs_once_per_prompt_seeded_from_the_row(tiny):
    cfg, fam, pipe = tiny
    with torch.no_grad():
        alone, meta = fam.prior(pipe, "a red fox", 5, 64, 64)
        again, _ = fam.prior(pipe, "a red fox", 5, 64, 64)
        other, meta2 = fam.prior(pipe, "a red fox", 6, 64, 64)
    assert alone.shape == (1, 16) and torch.equal(alone, again) and not torch.equal(alone, other)
    grid = alone.view(4, 4)[::2, ::2]
    assert torch.equal(alone.view(4, 4), grid.repeat_interleave(2, 0).repeat_interleave(2, 1))
    assert meta == {"prior_tokens_sha256": hashlib.sha256(grid.numpy().astype("<i8").tobytes()).hexdigest(),
                    "prior_grid": [2, 2]} and meta2 != meta
    # in a batch, each row's prior is its own (the same as alone), and its digest lands in request.meta
    req = request(fam, pipe, cfg, ["a blue owl", "a red fox"], seeds=(9, 5), steps=1)
    with torch.no_grad():
        fam.denoise(pipe, req)
    assert req.meta[1] == meta and req.meta[0] != meta


def test_staged_decode_gives_the_pipelines_bytes(tiny):
    cfg, fam, pipe = tiny
    req = request(fam, pipe, cfg, ["a red fox", "a blue owl"], seeds=(1, 2))
    with torch.no_grad():
        serial = to_uint8(fam.denoise_decode(pipe, req))
        staged = on_device(fam.decode(pipe, fam.denoise(pipe, req), req), req.meta)
    assert serial.shape == (2, 64, 64, 3) and np.array_equal(staged.pixels.numpy(), serial)
    assert [m["prior_grid"] for m in staged.meta] == [[2, 2], [2, 2]]
    plain = to_uint8(fam.denoise_decode(pipe, request(fam, pipe, cfg, ["a red fox", "a blue owl"], (1, 2),
                                                      cfg_on=False)))
    assert not np.array_equal(plain, serial) and not np.array_equal(serial[0], serial[1])


def test_real_preset_loads_saved_folder_and_matches(tiny, tmp_path):
    tiny_cfg, fam, pipe = tiny
    path = tmp_path / "glm_image_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=glm_image", f"model.path={path}", "model.dtype=float32", f"output_dir={tmp_path / 'o'}"])
    check_config(cfg)
    loaded = fam.load(cfg.model, torch.float32)
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded.transformer) is type(pipe.transformer)
    assert fam.spatial_divisor(cfg.model) == fam.spatial_divisor(tiny_cfg.model) == 32
    tok = fam.load_tokenizer(cfg.model)
    assert [n.used for n in fam.text_lengths(tok, PROMPTS, cfg.model, True)] == \
        [n.used for n in fam.text_lengths(fam.load_tokenizer(tiny_cfg.model), PROMPTS, tiny_cfg.model, True)]

    def image(p, c):
        req = request(fam, p, c, [PROMPTS[1]], seeds=(4,), steps=1)
        with torch.no_grad():
            return to_uint8(fam.denoise_decode(p, req)), fam.prior(p, PROMPTS[1], 4, 64, 64)[1]

    a, b = image(pipe, tiny_cfg), image(loaded, cfg)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]


def test_graph_replay_equals_eager_on_the_cpu_op_tape():
    """The GPU test's check (tests/gpu/test_family_graphs_gpu.py) on bcg's CPU op tape: with CFG the
    conditional and unconditional DiT calls of two prompts share one signature (equal glyph lengths,
    the drop mask a tensor input) and replay to the eager bytes."""
    from tests.gpu.test_family_graphs_gpu import check_family

    stats = check_family("glm_image", "cpu", "tape")
    assert stats["captures"] == 1 and stats["misses"] == 0 and stats["capture_failures"] == 0 and stats["hits"] > 0


def test_the_prior_runs_in_the_encode_stage_and_overlapping_keeps_the_bytes(tiny, monkeypatch):
    """The engine's encode stage makes each row's prior (on the prefetch thread when the stages
    overlap), seeded from the row: the same tokens, digests and pixels as the serial path."""
    import threading

    from jobs.worker.dispatcher import CaptureDispatcher
    from jobs.worker.pipeline import Pipeline
    from jobs.plan import Batch, Item, Signature
    from jobs.worker.scheduler import StageScheduler

    cfg, fam, pipe = tiny
    sig = Signature(height=64, width=64, text_bucket=1, steps=1, guidance_scale=1.5, cfg=True, dtype="float32")
    rows = [Item(key=f"k{i}", prompt=p, negative_prompt="", seed=s, signature=sig, text_tokens=1, truncated=False,
                 source=f"t:{i + 1}") for i, (p, s) in enumerate([("a red fox", 5), ("a blue owl", 9), ("a cat", 3)])]
    batches = [Batch(sig, rows[:2], 2), Batch(sig, rows[2:], 2)]  # the second has a dummy row
    engine = Pipeline(cfg, fam, pipe, get_padder("glm_image", buckets=[1], native_length=2048), None, "cpu")
    threads = []
    real_prior = fam.prior

    def prior(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real_prior(*args, **kwargs)

    monkeypatch.setattr(fam, "prior", prior)
    serial = [engine.generate(b) for b in batches]
    # once per row; the dummy row repeats the last row's prompt and seed, so it reuses its tokens
    assert len(threads) == 3 and threads[0] == threading.current_thread().name
    threads.clear()
    overlapped = list(StageScheduler(engine, CaptureDispatcher(None, engine.cfg.bcg), overlap=True).run(batches, lambda: False))
    assert threads == ["bcgen-encode"] * 3  # the encode stage's thread, not the denoising one
    with torch.no_grad():
        alone = real_prior(pipe, rows[2].prompt, rows[2].seed, 64, 64)[1]  # batched with a dummy row, yet its own
    metas = [m for r in serial for m in r.meta]
    assert metas == [m for r in overlapped for m in r.meta] and metas[2] == alone and len({str(m) for m in metas}) == 3
    for a, b in zip(serial, overlapped):
        assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images))
