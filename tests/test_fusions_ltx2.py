"""LTX-2 lossless fusions on the CPU (reference backend): the fused LTX2VideoTransformerBlock on a real tiny
LTX2VideoTransformer3DModel (the tiny preset's transformer: split RoPE; and its interleaved variant;
and an LTX-2.3-like one: gated attention, text cross-attention modulation, the perturbed processor)
leaves both outputs (video, audio) bit-identical, every block verified as a whole; the chains
(modulation stacks, RMSNorm + adaLN after the variance, gated residuals, q/k norm + RoPE) verified
against eager, the GPU-only plans not applicable; the CPU's addcmul contraction is the split RoPE
plan that verifies in float32 (aten's CUDA one rounds each product: the GPU tests' candidate); calls
the forward does not cover (perturbation, a foreign attention wrapper) and per-token timesteps run
eager; and under bcg's CPU op tape both text projections and every block's text K/V (ltx2_prompt)
run once per prompt batch, not once per step."""

from __future__ import annotations

import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import OPS, RULES, install_fusions

# conf/model/ltx2_tiny.yaml's transformer
TINY = dict(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
            cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
            audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
            caption_channels=32, rope_double_precision=False, rope_type="split")
# LTX-2.3's switches on the tiny geometry: per-head attention gates, the text cross-attention's
# modulation (9-row tables, prompt tables), the perturbed processor, no caption projection
LTX23 = dict(TINY, gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
             perturbed_attn=True, use_prompt_embeddings=False)
FRAMES, SIDE, AUDIO = 2, 4, 5  # latent frames, latent side, audio latents

# plans that are the GPU's (not applicable on the CPU), and the one the CPU's addcmul contraction rejects
# (the rounded products: tried after aten's FMA, so only where that one is not applicable)
GPU_ONLY = {"qk_ltx_interleaved_fused", "qk_ltx_split_fused_plain", "qk_ltx_split_fused_fma_bd_ad",
            "rms_variance_vec_dec", "rms_variance_vec_inc", "rms_variance_strided_dec", "rms_variance_strided_inc",
            "rms_variance_rows"}
CPU_REJECTS = {"qk_ltx_split_aten_plain"}


def tiny_model(dtype, config=None):
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(0)
    model = LTX2VideoTransformer3DModel(**(config or TINY))
    with torch.no_grad():  # the q/k norms' weights init to ones: random values exercise them
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, model, batch=2, text=6, seed=0, mask=False, per_token=False, shape=(FRAMES, SIDE, SIDE, AUDIO),
                **kw):
    """A transformer call as LTX2Pipeline makes it (the connectors' text, a timestep a sample); `shape`:
    latent frames, height, width and audio latents."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    frames, height, width, audio = shape
    n_video = frames * height * width
    widths = ((cfg.caption_channels,) * 2 if cfg.use_prompt_embeddings
              else (cfg.num_attention_heads * cfg.attention_head_dim,
                    cfg.audio_num_attention_heads * cfg.audio_attention_head_dim))
    t = torch.full((batch,), 500.0) if not per_token else 500.0 + torch.rand(batch, n_video, generator=g)
    inputs = dict(hidden_states=torch.randn(batch, n_video, cfg.in_channels, generator=g).to(dtype),
                  audio_hidden_states=torch.randn(batch, audio, cfg.audio_in_channels, generator=g).to(dtype),
                  encoder_hidden_states=torch.randn(batch, text, widths[0], generator=g).to(dtype),
                  audio_encoder_hidden_states=torch.randn(batch, text, widths[1], generator=g).to(dtype),
                  timestep=t, sigma=torch.full((batch,), 0.5), num_frames=frames, height=height, width=width, fps=24.0,
                  audio_num_frames=audio, return_dict=False, **kw)
    if per_token:
        inputs["audio_timestep"] = torch.full((batch,), 500.0)
    if mask:
        m = torch.ones(batch, text, dtype=torch.long)
        m[0, : text // 2] = 0
        inputs.update(encoder_attention_mask=m, audio_encoder_attention_mask=m)
    return inputs


def _run(model, cases):
    return [tuple(model(**kw)) for kw in cases]


def _equal(outs, refs) -> bool:
    return all(torch.equal(o, r) for out, ref in zip(outs, refs) for o, r in zip(out, ref))


def _verdicts(fx) -> tuple[set, set]:
    state = fx.verifier.state
    return {k[0] for k, ok in state.items() if ok}, {k[0] for k, ok in state.items() if not ok}


@pytest.mark.parametrize("rope_type, dtype, grad_mode", [
    ("split", torch.float32, torch.no_grad), ("split", torch.bfloat16, torch.inference_mode),
    ("interleaved", torch.float32, torch.inference_mode), ("interleaved", torch.bfloat16, torch.no_grad)])
def test_fused_blocks_equal_eager_and_leave_model_code(rope_type, dtype, grad_mode):
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    class_forward = LTX2VideoTransformerBlock.forward
    model = tiny_model(dtype, dict(TINY, rope_type=rope_type))
    blocks = list(model.transformer_blocks)
    cases = [tiny_inputs(dtype, model), tiny_inputs(dtype, model, batch=1, text=4, seed=1, mask=True)]
    with grad_mode():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        rules = [r for r, _, _ in fx.installed]
        assert rules.count("ltx2_block") == len(blocks) and rules.count("ltx2_prompt") == 2
        outs = [_run(model, cases) for _ in range(2)]  # first sight verifies, then fused
        assert fx.remove() == len(blocks) + 2
        after = _run(model, cases[:1])
    assert LTX2VideoTransformerBlock.forward is class_forward and all("forward" not in b.__dict__ for b in blocks)
    assert "forward" not in model.caption_projection.__dict__
    for again in outs:
        assert _equal(again, refs)
    assert _equal(after, refs[:1])
    c = fx.counters
    # every block and both projections, for both input keys
    assert c.forwards_verified == 2 * (len(blocks) + 2) and c.forwards_rejected == 0, c.rejections
    assert c.fused_calls > 0
    verified, not_here = _verdicts(fx)
    qk = "qk_ltx_split_aten" if rope_type == "split" else "qk_ltx_interleaved_aten"
    assert {"modulation_video", "rms_variance_sq_mean", "rms_norm_adaln", "gated_residual"} <= verified, verified
    assert any(v.startswith(qk) for v in verified), verified
    if rope_type == "split":  # aten's addcmul is an FMA: its plan is tried first, the rounded products never
        assert "qk_ltx_split_aten_fma_bd_ad" in verified and "qk_ltx_split_aten_plain" not in verified | not_here
    assert not_here <= GPU_ONLY | CPU_REJECTS, not_here
    assert all(r.split()[0] in CPU_REJECTS for r in c.rejections), c.rejections
    # the rule lists every chain its forward ran
    ops = set(RULES["ltx2_block"].ops)
    assert ops <= set(OPS) and (verified | not_here) - {"forward"} <= ops


def _attention_calls(model) -> list[int]:
    """Calls of the blocks' attention modules: the class's forward makes them, the fused one inlines."""
    calls = [0]
    for blk in model.transformer_blocks:
        for name in ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"):
            getattr(blk, name).register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_ltx23_switches_and_perturbation_fall_back_where_needed():
    """Gated attention, the text modulation (9-row tables, prompt tables from the prompt timestep) and the
    perturbed processor fuse; spatio-temporal guidance's perturbed block runs the class's forward (its
    attention modules called), the other block stays fused; isolated modalities skip a2v / v2a."""
    model = tiny_model(torch.float32, LTX23)
    assert RULES["ltx2_prompt"].check(model) is not None  # no caption projection: no prompt memo
    cases = [tiny_inputs(torch.float32, model), tiny_inputs(torch.float32, model, batch=1, seed=1, mask=True),
             tiny_inputs(torch.float32, model, seed=2, spatio_temporal_guidance_blocks=[0]),
             tiny_inputs(torch.float32, model, seed=3, isolate_modalities=True)]
    with torch.no_grad():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        assert [r for r, _, _ in fx.installed] == ["ltx2_block"] * 2
        calls = _attention_calls(model)
        outs = _run(model, cases[:2])
        first_sight = calls[0]
        outs += _run(model, cases[:2])
        fused = calls[0] - first_sight
        outs += _run(model, cases[2:3]) + _run(model, cases[2:3])
        stg = calls[0] - first_sight - fused
        outs += _run(model, cases[3:])
        fx.remove()
    assert _equal(outs, refs[:2] + refs[:2] + refs[2:3] + refs[2:])
    # first sight runs the class's forward beside the fused one (6 attentions x 2 blocks x 2 cases), then
    # the fused forwards alone inline them all; STG: block 0 (perturbed) runs the class's forward, in
    # the rewritten forward too (first sight 2 x 6, then 6), block 1 stays fused (its key seen before)
    assert first_sight == 6 * 2 * 2 and fused == 0 and stg == 2 * 6 + 6
    verified, not_here = _verdicts(fx)
    assert {"modulation_video", "rms_norm_adaln", "gated_residual", "adaln"} <= verified, verified
    assert fx.counters.forwards_rejected == 0


def test_calls_the_forward_does_not_cover_run_eager():
    """A foreign wrapper on an attention's forward: the class's forward for that block; and a timestep a
    token ([B, N, D] modulation, which the GPU kernels do not read: eager's ops there; the plain-torch
    plans here cover it) leaves the outputs eager's."""
    model = tiny_model(torch.float32)
    cases = [tiny_inputs(torch.float32, model, per_token=True)]
    blk = model.transformer_blocks[1]
    with torch.no_grad():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        outs = _run(model, cases)
        attn_forward = type(blk.attn1).forward
        blk.attn1.forward = lambda *a, **k: attn_forward(blk.attn1, *a, **k)  # not bcg's breaks
        calls = _attention_calls(model)
        outs += _run(model, cases)
        del blk.attn1.forward
        fx.remove()
    assert _equal(outs, refs + refs)
    assert calls[0] == 6  # block 1's six attentions through the class's forward, block 0 inlined
    assert fx.counters.forwards_verified == 2 + 2 and fx.counters.forwards_rejected == 0  # blocks, projections


def test_blocks_the_rule_cannot_take_keep_their_forward():
    model = tiny_model(torch.float32)
    check = RULES["ltx2_block"].check
    blk = model.transformer_blocks[0]
    assert check(blk) is None and RULES["ltx2_prompt"].check(model) is None
    saved = blk.attn2.processor
    blk.attn2.processor = type("OtherProcessor", (), {"__call__": lambda *a, **k: None})()
    assert "attn2 does not use LTX2AudioVideoAttnProcessor" in check(blk)
    blk.attn2.processor = saved
    blk.norm3.forward = blk.norm3.forward
    assert "norm3 carries a hook" in check(blk)
    del blk.norm3.forward
    blk.forward = blk.forward
    assert "instance forward" in check(blk)
    del blk.forward
    model.train()
    assert "training" in check(blk) and "training" in RULES["ltx2_prompt"].check(model)
    model.eval()
    with torch.no_grad():
        fx = install_fusions(model, backend="reference")
        try:
            assert check(blk) is not None  # installed: the rule's own forward is there now
        finally:
            fx.remove()


def _kv_calls(model) -> list[int]:
    calls = [0]
    for blk in model.transformer_blocks:
        for lin in (blk.attn2.to_k, blk.attn2.to_v, blk.audio_attn2.to_k, blk.audio_attn2.to_v):
            lin.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_text_kv_made_once_per_prompt_batch(grad_mode):
    model = tiny_model(torch.bfloat16)
    base = tiny_inputs(torch.bfloat16, model)
    steps = [dict(base, hidden_states=tiny_inputs(torch.bfloat16, model, seed=10 + i)["hidden_states"],
                  timestep=torch.full((2,), 900.0 - 100 * i)) for i in range(4)]
    with grad_mode():
        refs = _run(model, steps)
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="none")
        calls = _kv_calls(model)
        try:
            with runner.call_scope():  # one pipeline call
                outs = _run(model, steps[:1])  # warm-ups (eager) + capture
                made = calls[0]
                outs += _run(model, steps[1:])
                replay_calls = calls[0] - made
            c = runner.counters
        finally:
            runner.remove()
            fx.remove()
    assert _equal(outs, refs)
    assert made > 0 and replay_calls == 0  # three replays, no text K/V GEMM
    assert (c.hits, c.memo_reuses, c.memo_runs) == (3, 6, 0)  # two memos (video, audio text) a replay
    assert fx.counters.fused_calls > 0 and fx.counters.forwards_rejected == 0
