"""Lossless fusions on the CPU (no Triton): each chain's rounding plan (`reference`, what the Triton
kernel computes) equals eager bit for bit in bf16 and fp32; installation swaps forwards without
touching model code and leaves outputs identical; the verifier rejects, counts and logs a chain
that differs, and never verifies inside a capture."""

from __future__ import annotations

import logging
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bcg import RunnerConfig, apply_graph_runner
from bcg.config import TIERS, normalize_tier
from bcg.fusions import RULES, install_fusions, ops, registry
from bcg.fusions.verify import Verifier

DTYPES = [torch.bfloat16, torch.float32]
TINY = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
            num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
            caption_channels=24, sample_size=8)


def _rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


def elementwise_cases(dtype, B=2, N=24, D=48, heads=3):
    table = _rand(B, 6, D, dtype=dtype)
    shift, scale, gate = table.chunk(6, dim=1)[:3]
    lin = nn.Linear(D, D).to(dtype)
    return [
        (ops.ADALN, (_rand(B, N, D, dtype=dtype), scale, shift)),
        (ops.GATED_RESIDUAL, (_rand(B, N, D, dtype=dtype), gate, _rand(B, N, D, dtype=dtype))),
        (ops.GATED_RESIDUAL_LINEAR, (_rand(B, N, D, dtype=dtype), gate,
                                     _rand(B, D, N, dtype=dtype).transpose(1, 2), lin)),
        (ops.LINEAR_ATTENTION, (*(_rand(B, N, D, dtype=dtype) for _ in range(3)), heads)),
        (ops.GLU, (_rand(B, 16, 4, 4, dtype=dtype).contiguous(memory_format=torch.channels_last),)),
        (ops.MODULATION, (_rand(5, 6, D, dtype=dtype, scale=0.1), _rand(B, 6 * D, dtype=dtype), B)),
    ]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a, b) and a.stride() == b.stride() and a.dtype == b.dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_plans_equal_eager(dtype):
    torch.manual_seed(0)
    with torch.no_grad():
        for op, args in elementwise_cases(dtype):
            assert _same(op.reference(*args), op.eager(*args)), op.name


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_plans_equal_cudnn_order(dtype):
    """cuDNN convolves without the bias and adds it in a separate kernel (aten's _convolution);
    the CPU's oneDNN adds it inside the conv, so the CPU checks the plan against that order."""
    torch.manual_seed(0)
    conv1 = nn.Conv2d(8, 32, 1).to(dtype)
    conv_dw = nn.Conv2d(32, 32, 3, 1, 1, groups=32).to(dtype)
    x = _rand(2, 16, 8, dtype=dtype).unflatten(1, (4, 4)).permute(0, 3, 1, 2)
    with torch.no_grad():
        y = F.conv2d(x, conv1.weight, None).add_(conv1.bias.view(1, -1, 1, 1))
        assert _same(ops.CONV_BIAS_SILU.reference(x, conv1), F.silu(y))
        a = F.silu(y)
        d = F.conv2d(a, conv_dw.weight, None, 1, 1, 1, 32).add_(conv_dw.bias.view(1, -1, 1, 1))
        assert _same(ops.CONV_BIAS_GLU.reference(a, conv_dw), ops.GLU.eager(d))


def tiny_sana(dtype):
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    return SanaTransformer2DModel(**TINY).to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, 12, dtype=torch.int64)
    mask[:, 5:] = 0
    return dict(hidden_states=torch.randn(B, 4, 8, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(B, 12, 24, generator=g).to(dtype),
                timestep=(torch.rand(B, generator=g) * 1000).to(dtype), encoder_attention_mask=mask,
                return_dict=False)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])  # the job uses inference_mode
@pytest.mark.parametrize("dtype", DTYPES)
def test_install_and_remove_leave_model_code_and_outputs(dtype, grad_mode):
    from diffusers.models.transformers.sana_transformer import SanaTransformerBlock

    class_forward = SanaTransformerBlock.forward
    model = tiny_sana(dtype)
    kw = tiny_inputs(dtype)
    with grad_mode():
        ref = model(**kw)[0]
        fx = install_fusions(model, backend="reference")
        # every block, and the caption path's two modules (sana_prompt)
        assert [r for r, _, _ in fx.installed].count("sana_block") == TINY["num_layers"]
        assert [m for r, m, _ in fx.installed if r == "sana_prompt"] == [model.caption_projection, model.caption_norm]
        assert all("forward" in b.__dict__ for b in model.transformer_blocks)
        outs = [model(**kw)[0] for _ in range(2)]  # first sight verifies, then the fused plans
        assert fx.remove() == TINY["num_layers"] + 2
        after = model(**kw)[0]
    assert SanaTransformerBlock.forward is class_forward
    assert all("forward" not in m.__dict__ for m in [*model.transformer_blocks, model.caption_projection,
                                                     model.caption_norm])
    assert all(torch.equal(o, ref) for o in outs) and torch.equal(after, ref)
    c = fx.counters
    assert c.verified >= 5 and c.fused_calls > 0
    # Only the conv chains may differ on the CPU (oneDNN fuses the bias; see above): their
    # fallbacks run instead, and the output is still eager's.
    conv_chains = ("conv_bias_silu", "conv_bias_glu", "dwconv_glu_rows", "dwconv_glu_cols",
                   "silu_dwconv_glu")
    assert all(r.split()[0] in conv_chains for r in c.rejections), c.rejections


def test_blocks_with_their_own_forward_are_left_alone():
    model = tiny_sana(torch.float32)
    blk = model.transformer_blocks[0]
    mine = blk.forward
    blk.forward = mine  # an instance forward: someone else's wrapper
    fx = install_fusions(model, backend="reference")
    blocks = [m for r, m, _ in fx.installed if r == "sana_block"]
    assert len(blocks) == TINY["num_layers"] - 1 and blk.__dict__["forward"] is mine
    fx.remove()
    assert blk.__dict__["forward"] is mine


def _bad_reference(x, scale, shift):
    out = ops.ADALN.reference(x, scale, shift)
    return torch.nextafter(out.float(), torch.full_like(out.float(), float("inf"))).to(out.dtype)


def test_verifier_rejects_counts_and_logs_once(caplog):
    bad = ops.Op("adaln_bad", ops.ADALN.eager, _bad_reference, ops.ADALN.fused)
    fx = Verifier("reference")
    x, tab = _rand(2, 4, 8, dtype=torch.float32), _rand(2, 6, 8, dtype=torch.float32)
    want = ops.ADALN.eager(x, tab[:, 1:2], tab[:, 0:1])
    with caplog.at_level(logging.WARNING, logger="bcg.fusions.verify"):
        outs = [fx.call(bad, x, tab[:, 1:2], tab[:, 0:1]) for _ in range(3)]
    assert all(torch.equal(o, want) for o in outs)  # eager's bits every time
    c = fx.counters
    assert (c.verified, c.rejected, c.fused_calls, c.eager_calls) == (0, 1, 0, 2)
    assert len(c.rejections) == 1 and "adaln_bad" in c.rejections[0]
    assert sum("differs from eager" in r.message for r in caplog.records) == 1
    # a new shape is a new key: verified on its own
    fx.call(bad, x[:1], tab[:1, 1:2], tab[:1, 0:1])
    assert c.rejected == 2


def test_verifier_rejects_a_chain_that_raises():
    def boom(*a):
        raise RuntimeError("no kernel for this layout")

    op = ops.Op("boom", ops.GATED_RESIDUAL.eager, boom, boom)
    fx = Verifier("reference")
    h = _rand(1, 3, 4, dtype=torch.bfloat16)
    out = fx.call(op, h, h[:, :1], h)
    assert torch.equal(out, ops.GATED_RESIDUAL.eager(h, h[:, :1], h))
    assert fx.counters.rejected == 1 and "RuntimeError" in fx.counters.rejections[0]


@pytest.mark.parametrize("warmup, verified_in_capture", [(0, True), (1, False)])
def test_capture_never_verifies(warmup, verified_in_capture):
    """The runner's warm-up forwards (eager, before each capture: bcg/entry.py) see each key
    first; a key first seen inside a capture runs the module's own forward there (guard.py) and is
    verified later. One warm-up also covers the paths that verified forwards open for the next
    module (the prompt memo's K/V, the norm handed from block to block): a verified forward returns
    its own outputs, so the next module sees that state in the same forward."""
    model = tiny_sana(torch.float32)
    kw = tiny_inputs(torch.float32)
    with torch.no_grad():
        ref = model(**kw)[0]
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off", warmup_iters=warmup))
        try:
            out = model(**kw)[0]  # capture on the CPU op tape
            again = model(**kw)[0]  # replay
        finally:
            runner.remove()
            fx.remove()
    assert torch.equal(out, ref) and torch.equal(again, ref)
    c = fx.counters
    assert (c.forwards_unverified_in_capture > 0) == verified_in_capture
    assert (c.verified > 0) != verified_in_capture and (c.forwards_verified > 0) != verified_in_capture


def test_tiers_and_runner_config():
    assert TIERS == ("lossless", "fast", "off")
    assert [normalize_tier(v) for v in (True, False, "fast", "off")] == ["lossless", "off", "fast", "off"]
    assert RunnerConfig().tier == "lossless"
    assert RunnerConfig(compile=True).tier == "fast" and RunnerConfig(fusions="off").tier == "off"
    with pytest.raises(ValueError, match="lossless, fast, off"):
        RunnerConfig(fusions="turbo")
    model = tiny_sana(torch.float32)
    runner = apply_graph_runner(model, RunnerConfig())  # no CUDA: eager, nothing installed
    try:
        assert runner.fusions is None and runner.stats()["fusions"] == {"tier": "lossless"}
        assert all("forward" not in b.__dict__ for b in model.transformer_blocks)
    finally:
        runner.remove()


def test_registry_refuses_duplicates_and_names_the_known():
    with pytest.raises(ValueError, match="already registered"):
        registry.register(RULES["sana_block"])
    with pytest.raises(ValueError, match="sana_block"):
        registry.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        ops.register(ops.ADALN)


def test_job_config_tier_is_part_of_run_identity():
    from jobs.config import BcgConfig, GenerateConfig
    from jobs.plan.identity import run_identity

    assert BcgConfig().fusions == "lossless"
    with pytest.raises(Exception, match="bcg.fusions"):
        BcgConfig(fusions="turbo")
    a = run_identity(GenerateConfig(), "d", 1)
    cfg = GenerateConfig()
    cfg.bcg.fusions = "off"
    assert a["bcg_fusions"] == "lossless" and run_identity(cfg, "d", 1)["bcg_fusions"] == "off"


def test_inlined_cross_attention_keeps_the_attention_breaks():
    """The fused block inlines attn2's processor; with break_policy "attention" its SDPA must
    still run as a break between segments (the CPU op tape records them like CUDA graphs)."""
    model = tiny_sana(torch.float32)
    cases = [tiny_inputs(torch.float32, seed=s) for s in range(2)]
    with torch.no_grad():
        refs = [model(**kw)[0] for kw in cases]
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="attention")
        try:
            outs = [model(**kw)[0] for kw in cases + cases]
            stats = runner.stats()
        finally:
            runner.remove()
            fx.remove()
    assert all(torch.equal(o, r) for o, r in zip(outs, refs + refs))
    # one break a block (its SDPA) and the prompt-state memo (sana_prompt): layers + 2 segments
    assert {(e["segments"], e["breaks"], e["memo_breaks"]) for e in stats["entries"]} == {
        (TINY["num_layers"] + 2, TINY["num_layers"] + 1, 1)}
    assert fx.counters.verified > 0


def test_mask_cache_serves_one_forward_and_misses_on_a_new_mask():
    from bcg.fusions.sana import MaskCache

    model = tiny_sana(torch.float32)
    attn = model.transformer_blocks[0].attn2
    cache = MaskCache()
    m = torch.zeros(2, 1, 12)
    a = cache.get(attn, m, 12, 2)
    assert cache.get(attn, m, 12, 2) is a  # the next block of the same forward
    m.add_(1)  # an in-place change is a new version: prepared again
    b = cache.get(attn, m, 12, 2)
    assert b is not a and torch.equal(b, attn.prepare_attention_mask(m, 12, 2))
    assert cache.get(attn, m.clone(), 12, 2) is not b  # another tensor


def test_modulation_cache_makes_every_block_once_a_forward():
    """One add for every block's scale_shift_table + timestep a forward: the other blocks take their
    slice (the same tensor object), a new timestep tensor or another batch size makes it again, and
    so does a table edited in place since (a LoRA fused); each slice equals the block's own add."""
    from bcg.fusions.sana import ModulationCache

    model = tiny_sana(torch.bfloat16)
    blocks = list(model.transformer_blocks)
    fx = Verifier("reference")
    cache = ModulationCache()
    for b in blocks:
        cache.add(b)
    t = _rand(2, blocks[0].scale_shift_table.numel(), dtype=torch.bfloat16)
    with torch.no_grad():
        first = [cache.get(fx.call, b, t, 2) for b in blocks]
        again = [cache.get(fx.call, b, t, 2) for b in blocks]
        for b, m in zip(blocks, first):
            assert _same(m, b.scale_shift_table[None] + t.reshape(2, 6, -1))
        assert all(x.data_ptr() == y.data_ptr() for x, y in zip(first, again))
        assert fx.counters.verified == 1 and fx.counters.fused_calls == 0  # one stacked add, verified once
        blocks[1].scale_shift_table.add_(1)  # edited in place: stacked again, with the new values
        m = cache.get(fx.call, blocks[1], t, 2)
        assert _same(m, blocks[1].scale_shift_table[None] + t.reshape(2, 6, -1))
        t2 = t.clone()
        assert cache.get(fx.call, blocks[0], t2, 2).data_ptr() != first[0].data_ptr()  # another tensor
    assert fx.counters.fused_calls == 2


def test_norm_handoff_is_taken_only_by_its_block_with_that_tensor():
    """Block i leaves the next block's norm1 output beside its own output; the next block takes it
    only for that very tensor, unedited, with the same timestep embedding. Anything else (another
    block, a copy, an in-place edit, another embedding) drops it, and the block normalises itself."""
    from bcg.fusions.sana import NormHandoff

    a, b = nn.Identity(), nn.Identity()
    h, t, n = torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)
    handoff = NormHandoff()
    handoff.put(b, h, t, n)
    assert handoff.take(b, h, t) is n and handoff.take(b, h, t) is None  # taken once
    for block, hidden, step in ((a, h, t), (b, h.clone(), t), (b, h, t.clone())):
        handoff.put(b, h, t, n)
        assert handoff.take(block, hidden, step) is None and handoff.entry is None
    handoff.put(b, h, t, n)
    h.add_(1)  # edited in place after it was normalised
    assert handoff.take(b, h, t) is None


def test_every_block_but_the_last_hands_its_norm_on():
    """Three blocks: blocks 0 and 1 end in the residual + next norm1 kernel, the last in the plain
    gated residual; only block 0 normalises its own input; the output is eager's, bit for bit."""
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    model = SanaTransformer2DModel(**{**TINY, "num_layers": 3}).to(torch.bfloat16).eval().requires_grad_(False)
    kw = tiny_inputs(torch.bfloat16)
    calls: dict = {}
    real = Verifier.call

    def counting(self, op, *args, **kwargs):  # every chain a fused forward asks the verifier for
        calls[op.name] = calls.get(op.name, 0) + 1
        return real(self, op, *args, **kwargs)

    with torch.inference_mode(), mock.patch.object(Verifier, "call", counting):
        ref = model(**kw)[0]
        fx = install_fusions(model, backend="reference")
        model(**kw)  # verifies
        calls.clear()
        out = model(**kw)[0]
        fx.remove()
    assert torch.equal(out, ref)
    assert not [r for r in fx.counters.rejections if "ln_adaln" in r.split()[0]], fx.counters.rejections
    assert calls["gated_res_ln_adaln"] == 2 and calls["gated_residual"] == 1 and calls["ln_adaln"] == 1, calls


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_chains_replace_the_two_kernel_path_and_keep_eager_bits(dtype):
    """LN + adaLN (and the cross-attention residual before norm2) run as one op each; on the CPU
    the reference plan (aten's CPU LayerNorm, then adaLN's rounding) verifies, so the two-kernel
    fallback (aten LN, then the adaLN chain) never runs."""
    model = tiny_sana(dtype)
    kw = tiny_inputs(dtype)
    with torch.inference_mode():
        ref = model(**kw)[0]
        fx = install_fusions(model, backend="reference")
        outs = [model(**kw)[0] for _ in range(2)]
        fx.remove()
    assert all(torch.equal(o, ref) for o in outs)
    verified = {k[0] for k, ok in fx.verifier.state.items() if ok}
    seen = {k[0] for k in fx.verifier.state}
    assert {"ln_adaln", "res_ln_adaln", "gated_res_ln_adaln", "modulation"} <= verified
    assert fx.verifier.shared["sana_norm_handoff"].entry is None  # the last block took what it was left
    assert not seen & {"adaln", "rescale_residual"}, seen


def test_norm_key_includes_eps():
    from bcg.fusions import ops_norm

    v = Verifier("reference")
    x = _rand(1, 4, 8, dtype=torch.float32)
    s = _rand(1, 1, 8, dtype=torch.float32)
    a, b = nn.LayerNorm(8, elementwise_affine=False), nn.LayerNorm(8, eps=1e-3, elementwise_affine=False)
    assert v.key(ops_norm.LN_ADALN, (x, a, s, s)) != v.key(ops_norm.LN_ADALN, (x, b, s, s))
