"""CUDA graph replay equals eager, bit for bit (torch.equal), on real diffusers Sana transformers.

Run on the GPU machine: `python -m pytest tests/gpu/test_bcg_gpu.py -q -s` (skipped without CUDA).
"""

import logging
import time

import pytest
import torch

from bcg import Dispatch, RunnerConfig, apply_graph_runner

pytestmark = pytest.mark.gpu

# Efficient-Large-Model/Sana_1600M_1024px_MultiLing_diffusers transformer/config.json
SANA_1600M = dict(
    in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
    num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
    caption_channels=2304, mlp_ratio=2.5, attention_bias=False, sample_size=32, patch_size=1,
    norm_elementwise_affine=False, norm_eps=1e-6,
)
TINY = dict(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
    num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
    caption_channels=24, sample_size=8,
)


def build(config, dtype):
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = SanaTransformer2DModel(**config)
    return model.to(dtype).eval().requires_grad_(False)


def cfg_inputs(config, dtype, batch=1, side=8, text=12, real=5, seed=0):
    """Classifier-free guidance: negative and positive rows in one 2B batch, masked text tails."""
    g = torch.Generator("cuda").manual_seed(seed)
    b2 = 2 * batch
    mask = torch.zeros(b2, text, dtype=torch.int64, device="cuda")
    mask[:batch, :3] = 1          # the negative prompt: short
    mask[batch:, :real] = 1
    t = torch.tensor(700.0 - 10 * seed, device="cuda")
    return dict(
        hidden_states=torch.randn(b2, config["in_channels"], side, side, generator=g, device="cuda").to(dtype),
        encoder_hidden_states=torch.randn(b2, text, config["caption_channels"], generator=g,
                                          device="cuda").to(dtype),
        encoder_attention_mask=mask,
        timestep=t.expand(b2).to(dtype),
        return_dict=False,
    )


def check_replays(model, policy, cases, expect_segments=None):
    """Eager references first, then capture + replays through the runner: all torch.equal."""
    with torch.no_grad():
        refs = [model(**kw)[0] for kw in cases]
        assert all(torch.isfinite(r).all() for r in refs)
        runner = apply_graph_runner(model, RunnerConfig(debug_check_buffers=True), break_policy=policy)
        try:
            assert runner.mode == "cuda"
            outs = [model(**kw)[0] for kw in cases]
            again = [model(**kw)[0] for kw in cases]
            stats = runner.stats()
        finally:
            runner.remove()
    for i, (ref, out, out2) in enumerate(zip(refs, outs, again)):
        assert torch.equal(out, ref), (policy, i, (out.float() - ref.float()).abs().max().item())
        assert torch.equal(out2, ref), (policy, i)
    assert stats["misses"] == 0 and stats["capture_failures"] == 0
    if expect_segments is not None:
        assert {e["segments"] for e in stats["entries"]} == {expect_segments}
    return stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# Segments: the lossless tier's prompt memo (bcg/fusions/sana_prompt.py) is one break more.
@pytest.mark.parametrize("policy, segments", [("none", 2), ("attention", TINY["num_layers"] + 2)])
def test_tiny_sana_replay_equals_eager(dtype, policy, segments):
    model = build(TINY, dtype)
    cases = [cfg_inputs(TINY, dtype, seed=s) for s in range(3)]
    stats = check_replays(model, policy, cases, segments)
    assert (stats["captures"], stats["hits"]) == (1, 5)


@pytest.mark.parametrize("policy", ["none", "attention"])
def test_live_warmup_calls_and_the_capture_after_them_equal_eager(policy):
    """warmup="live" on CUDA: the first two calls run eager on the capture's side stream, the third
    captures without extra forwards, the rest replay; every output is eager's, bit for bit."""
    model = build(TINY, torch.bfloat16)
    cases = [cfg_inputs(TINY, torch.bfloat16, seed=s) for s in range(5)]
    with torch.no_grad():
        refs = [model(**kw)[0] for kw in cases]
        runner = apply_graph_runner(model, RunnerConfig(warmup="live", debug_check_buffers=True),
                                    break_policy=policy)
        try:
            outs = [model(**kw)[0] for kw in cases]
            stats = runner.stats()
        finally:
            runner.remove()
    for i, (ref, out) in enumerate(zip(refs, outs)):
        assert torch.equal(out, ref), (policy, i, (out.float() - ref.float()).abs().max().item())
    assert (stats["warmups"], stats["captures"], stats["hits"], stats["misses"]) == (2, 1, 2, 0), stats


@pytest.fixture(scope="module")
def sana16b():
    model = build(SANA_1600M, torch.bfloat16)
    yield model
    del model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("policy, segments", [("none", 2), ("attention", 22)])
def test_sana_1600m_replay_equals_eager_cfg_two_text_lengths(sana16b, policy, segments):
    # 512^2 (16x16 latents), CFG batch 2, two text buckets (64, 128) with masked tails.
    cases = [cfg_inputs(SANA_1600M, torch.bfloat16, side=16, text=text, real=47, seed=s)
             for text in (64, 128) for s in (0, 1)]
    stats = check_replays(sana16b, policy, cases, segments)
    assert (stats["captures"], stats["hits"]) == (2, 6)
    per_sig = stats["capture_seconds"] / stats["captures"]
    print(f"\n[bcg gpu] policy={policy}: capture {per_sig:.2f} s/signature, "
          f"graph memory {[e['graph_bytes'] / 2**20 for e in stats['entries']]} MiB")
    assert per_sig < 10.0  # the 3 s target is measured by benchmarks/bench_denoise.py


def test_sana_1600m_batch4_1024_replay_equals_eager(sana16b):
    cases = [cfg_inputs(SANA_1600M, torch.bfloat16, batch=4, side=32, text=300, real=47, seed=s)
             for s in (0, 1)]
    check_replays(sana16b, "none", cases, 2)


def test_release_all_returns_graph_memory(sana16b):
    kw = cfg_inputs(SANA_1600M, torch.bfloat16, side=32, text=300, real=47)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    runner = apply_graph_runner(sana16b, RunnerConfig())
    try:
        with torch.no_grad():
            sana16b(**kw)
        held = torch.cuda.memory_reserved() - before
        assert runner.counters.graph_bytes > 0
        runner.release_all()
        after = torch.cuda.memory_reserved() - before
    finally:
        runner.remove()
    print(f"\n[bcg gpu] reserved over baseline: {held / 2**20:.0f} MiB with the graph, "
          f"{after / 2**20:.0f} MiB after release_all")
    assert after < held


class HostReading(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.abs().max().item() > 1e9:  # a host sync: illegal while capturing
            y = y * 0
        return y + 1


def test_failed_capture_runs_eager_and_the_next_capture_works(caplog):
    m = HostReading().cuda()
    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        ref = m(x)
        runner = apply_graph_runner(m, RunnerConfig())
        with caplog.at_level(logging.WARNING, logger="bcg"):
            out = m(x)
        runner.remove()
        assert torch.equal(out, ref)
        assert runner.counters.capture_failures == 1
        assert any("capture failed" in r.getMessage() for r in caplog.records)
        # The job goes on: CUDA is healthy and a later capture of another model works.
        model = build(TINY, torch.float32)
        t0 = time.perf_counter()
        check_replays(model, "attention", [cfg_inputs(TINY, torch.float32, seed=s) for s in (0, 1)])
        assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_forward_replay_equals_compiled_eager(dtype):
    """bcg.compile: the compiled kernels replayed from a graph give the compiled forward's bits."""
    torch._dynamo.reset()
    model = build(TINY, dtype)
    cases = [cfg_inputs(TINY, dtype, seed=s) for s in range(3)]
    with torch.no_grad():
        runner = apply_graph_runner(model, RunnerConfig(compile=True))
        try:
            runner.dispatch = Dispatch.REPLAY  # nothing captured yet: the compiled forward, run eagerly (the reference)
            refs = [model(**kw)[0].clone() for kw in cases]
            runner.dispatch = Dispatch.CAPTURE
            outs = [model(**kw)[0] for kw in cases]
            stats = runner.stats()
        finally:
            runner.remove()
            torch._dynamo.reset()
    for ref, out in zip(refs, outs):
        assert torch.equal(out, ref)
    assert stats["captures"] == 1 and stats["hits"] == 2 and stats["capture_failures"] == 0


def test_compile_refuses_breaks():
    model = build(TINY, torch.float32)
    with pytest.raises(ValueError, match="needs break_policy 'none'"):
        apply_graph_runner(model, RunnerConfig(compile=True), break_policy="attention")
