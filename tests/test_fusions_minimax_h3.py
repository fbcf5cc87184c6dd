"""MiniMax-H3 lossless fusions on the CPU (reference backend): the fused MiniMaxH3TransformerBlock and final
MiniMaxH3AdaLayerNormOut on a real tiny MiniMaxH3Transformer3DModel (conf/model/minimax_h3_tiny.yaml's
transformer, seeded random weights, random norm weights) leave its outputs bit-identical, in fp32 and bf16
(cast as the job loads it: `_keep_in_fp32_modules` kept), for a batch-1 and a batch-2 call built as
jobs/models/minimax_h3.py builds them; every block and the final norm verified as a whole against their own
forwards; the chains (per-row adaLN and gated residuals at batch 1, the q / k RMSNorm + partial rotate-half
RoPE in fp32) verified against eager; a rotary table whose halves differ stays exact; the class forwards
untouched after remove()."""

from __future__ import annotations

import pytest
import torch

from bcg.fusions import OPS, RULES, install_fusions

# conf/model/minimax_h3_tiny.yaml's transformer
TINY = dict(num_attention_heads=2, attention_head_dim=24, hidden_size=32, num_layers=2, num_refiner_layers=1,
            ffn_dim=64, in_channels=4, audio_in_channels=4, patch_size=(1, 2, 2), text_dim=16, freq_dim=16,
            time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=4)
AUDIO_CHANNELS = 2  # MINIMAX_H3_AUDIO_CHANNELS


def tiny_model(dtype, config=None):
    from diffusers import MiniMaxH3Transformer3DModel

    from jobs.models.minimax_h3 import cast_keeping_fp32

    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**(TINY if config is None else config))
    with torch.no_grad():  # non-trivial norm weights (the blocks', the q / k norms', the refiner's, norm_out's)
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "norm_q" in name \
                    or "norm_k" in name or name.endswith("norm.weight"):
                p.copy_(1 + 0.25 * torch.randn(p.shape))
    if dtype != torch.float32:
        cast_keeping_fp32(model, dtype)
    return model.eval().requires_grad_(False)


def tiny_inputs(dtype, batch=1, text=5, frames=2, side=4, audio=3, seed=0, t=0.7, ta=0.55, config=None):
    """A DiT call as jobs/models/minimax_h3.py makes it: the t2va packed layout (build_packed_sequence),
    the per-row timestep plan (build_row_timesteps), video / audio noise rows, the text rows."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
    )

    c = TINY if config is None else config
    pos, tags, video, aud, txt, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.full((text,), 1, dtype=torch.long), frames, side, side, audio, tuple(c["patch_size"]), AUDIO_CHANNELS,
        2, 0)
    timestep, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(video, aud, 0, 0, txt.numel(), t, ta,
                                                                      max(t, 0.999), 1.0)
    g = torch.Generator().manual_seed(seed)
    patch = c["in_channels"] * c["patch_size"][0] * c["patch_size"][1] * c["patch_size"][2]
    return dict(hidden_states=torch.randn(batch, video.numel(), patch, generator=g),
                audio_hidden_states=torch.randn(batch, aud.numel(), c["audio_in_channels"], generator=g),
                encoder_hidden_states=torch.randn(batch, text, c["text_dim"], generator=g).to(dtype),
                timestep=timestep, timestep_indices=indices, token_tags=tags, position_ids=pos,
                video_indices=video, audio_indices=aud, text_indices=txt, return_dict=False)


def _run(model, cases):
    return [model(**kw) for kw in cases]


def _fused(model) -> list:
    return list(model.transformer_blocks) + [model.norm_out]


def _verdicts(fx) -> tuple[set, set]:
    state = fx.verifier.state
    return {k[0] for k, ok in state.items() if ok}, {k[0] for k, ok in state.items() if not ok}


@pytest.mark.parametrize("dtype, grad_mode", [(torch.float32, torch.no_grad), (torch.bfloat16, torch.inference_mode)])
def test_fused_blocks_equal_eager_and_leave_model_code(dtype, grad_mode):
    from diffusers.models.transformers import transformer_minimax_h3 as T

    forwards = (T.MiniMaxH3TransformerBlock.forward, T.MiniMaxH3AdaLayerNormOut.forward)
    model = tiny_model(dtype)
    cases = [tiny_inputs(dtype), tiny_inputs(dtype, batch=2, text=3, side=2, audio=2, seed=1, t=0.4, ta=0.3)]
    with grad_mode():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        rules = [r for r, _, _ in fx.installed]
        assert rules.count("minimax_h3_block") == len(model.transformer_blocks)
        assert rules.count("minimax_h3_norm_out") == 1
        outs = [_run(model, cases) for _ in range(2)]  # first sight verifies, then fused
        assert fx.remove() == len(_fused(model))
        after = _run(model, cases[:1])
    assert (T.MiniMaxH3TransformerBlock.forward, T.MiniMaxH3AdaLayerNormOut.forward) == forwards
    assert all("forward" not in m.__dict__ for m in _fused(model))
    for again in outs:
        for got, ref in zip(again, refs):
            assert all(torch.equal(o, r) for o, r in zip(got, ref))
    assert all(torch.equal(o, r) for o, r in zip(after[0], refs[0]))
    c = fx.counters
    # every block and the final norm, for both input keys
    assert c.forwards_verified == 2 * len(_fused(model)) and c.forwards_rejected == 0, c.rejections
    assert c.rejected == 0 and c.not_applicable == 0 and c.fused_calls > 0, c
    verified, not_here = _verdicts(fx)
    # batch 1: the per-row modulation chains; the rotation: fp32 the split kernel, bf16 the real-pair one
    want = {"adaln", "gated_residual", "qk_minimax_split_plain" if dtype == torch.float32 else "qk_minimax_pairs"}
    assert want <= verified, verified
    assert not not_here, not_here
    # the rules list every chain their forwards ran
    ops = set(RULES["minimax_h3_block"].ops) | set(RULES["minimax_h3_norm_out"].ops)
    assert ops <= set(OPS) and verified - {"forward"} <= ops


@pytest.mark.parametrize("dtype, op", [(torch.float32, "qk_minimax_split_plain"), (torch.bfloat16, "qk_minimax_pairs")])
def test_a_rotary_table_whose_halves_differ_stays_exact(dtype, op):
    """The split kernel reads one cos / sin a rotate-half pair (the op calls it once a half), the pairs' layout
    interleaves both halves' values: a table whose halves differ (not MiniMaxH3RotaryPosEmbed's, whose halves
    repeat) is as exact as the model's own."""
    model = tiny_model(dtype)
    block = model.transformer_blocks[0]
    kw = tiny_inputs(dtype)
    S, D = kw["position_ids"].shape[0], TINY["hidden_size"]
    cos, sin = model.rope(kw["position_ids"])
    h = cos.shape[1] // 2
    assert torch.equal(cos[:, :h], cos[:, h:])
    g = torch.Generator().manual_seed(3)
    odd = (cos + 0.25 * torch.rand(cos.shape, generator=g), sin - 0.25 * torch.rand(sin.shape, generator=g))
    hidden = torch.randn(1, S, D, generator=g).to(dtype)
    temb = torch.randn(2, TINY["time_embed_dim"], generator=g)
    idx = kw["timestep_indices"] * 3 + kw["token_tags"]
    with torch.no_grad():
        refs = [block(hidden, temb, idx, t) for t in ((cos, sin), odd)]
        fx = install_fusions(model, backend="reference")
        outs = [block(hidden, temb, idx, t) for t in ((cos, sin), odd, odd, (cos, sin))]
        fx.remove()
    assert all(torch.equal(o, r) for o, r in zip(outs, refs + refs[::-1]))
    c = fx.counters
    assert c.forwards_verified == 1 and c.forwards_rejected == 0 and c.rejected == 0 and c.eager_calls == 0, c
    verified, not_here = _verdicts(fx)
    assert op in verified and not not_here


def test_other_processors_keep_the_module_forward():
    model = tiny_model(torch.float32)
    blk = model.transformer_blocks[0]
    assert RULES["minimax_h3_block"].check(blk) is None
    blk.attn.processor = type("OtherProcessor", (), {"__call__": lambda *a, **k: None})()
    assert "MiniMaxH3AttnProcessor" in RULES["minimax_h3_block"].check(blk)


_INTERPRETED = """
import json, torch
from bcg.fusions import Fusions
from tests.test_fusions_minimax_h3 import tiny_inputs, tiny_model
model = tiny_model(torch.float32)
cases = [tiny_inputs(torch.float32)]
with torch.no_grad():
    refs = [model(**kw) for kw in cases]
    fx = Fusions(model, "triton")
    fx.verifier.cache = None  # no verdicts written to the user's cache
    fx.install()
    outs = [model(**kw) for kw in cases + cases]
    fx.remove()
c = fx.counters
print("RESULT " + json.dumps(dict(equal=[all(torch.equal(a, b) for a, b in zip(o, r))
                                         for o, r in zip(outs, refs + refs)],
                                  not_applicable=c.not_applicable, forwards_rejected=c.forwards_rejected,
                                  forwards_verified=c.forwards_verified, rejected=c.rejected,
                                  verified=sorted({k[0] for k, ok in fx.verifier.state.items() if ok}))))
"""


@pytest.mark.slow
def test_the_triton_launchers_apply_under_the_interpreter():
    """The GPU path's launchers (backend "triton") under Triton's CPU interpreter on the tiny model in fp32 at
    batch 1: the adaLN and gated-residual kernels apply to the per-row [S, 1, D] views, the split RoPE kernel
    to the leading channels of each head, none is "not applicable" or rejected, the output eager's bits."""
    import json

    from tests.helpers import run_interpreted

    pytest.importorskip("triton")
    out = run_interpreted(_INTERPRETED)
    got = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert all(got["equal"]) and got["not_applicable"] == 0 and got["forwards_rejected"] == 0, got
    assert got["rejected"] == 0 and got["forwards_verified"] == TINY["num_layers"] + 1, got
    assert {"adaln", "gated_residual", "qk_minimax_split_plain"} <= set(got["verified"]), got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_minimax_h3_captures_and_replays_on_the_tape(dtype):
    """Under bcg's CPU op tape (the CUDA graph's stand-in), as the job calls the DiT (no attention breaks:
    the preset's break_policy none): capture after eager warm-ups, replays, every output eager's bits, the
    chains fused and verified before any capture."""
    from bcg import RunnerConfig, apply_graph_runner

    model = tiny_model(dtype)
    cases = [tiny_inputs(dtype, seed=s) for s in range(2)]
    with torch.no_grad():
        refs = _run(model, cases)
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="none")
        try:
            outs = _run(model, cases + cases)
            stats = runner.stats()
        finally:
            runner.remove()
            fx.remove()
    for got, ref in zip(outs, refs + refs):
        assert all(torch.equal(o, r) for o, r in zip(got, ref))
    c = fx.counters
    assert stats["hits"] >= 2 and c.forwards_unverified_in_capture == 0 and c.unverified_in_capture == 0, (stats, c)
    assert c.forwards_rejected == 0 and c.rejected == 0 and c.not_applicable == 0 and c.fused_calls > 0, c
