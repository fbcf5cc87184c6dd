"""Wan lossless fusions on the CPU (reference backend): the fused WanTransformerBlock on a real tiny
WanTransformer3DModel (the tiny preset's transformer: head dim 12, cross_attn_norm) leaves its
outputs bit-identical, every block verified as a whole; the fp32-plan chains (FP32LayerNorm +
modulation, the gated residuals, the affine norm2, the residual + norm3) and the q/k chain (aten's
norm, the 3-D RoPE's interleaved pairs) verified against eager; every block's modulation made in one
add a forward; and under bcg's CPU op tape the text projection and every block's cross-attention
K/V (the wan_prompt memo) run once per prompt batch, not once per step."""

from __future__ import annotations

import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import install_fusions

# conf/model/wan_tiny.yaml's transformer
TINY = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
            text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def tiny_model(dtype):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(**TINY)
    with torch.no_grad():  # norm weights init to ones / zeros: random values exercise them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1 if name.endswith("weight") else 0) + 0.3 * torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, batch=2, text=6, frames=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(batch, TINY["in_channels"], frames, 4, 4, generator=g).to(dtype),
                timestep=torch.full((batch,), 500.0), return_dict=False,
                encoder_hidden_states=torch.randn(batch, text, TINY["text_dim"], generator=g).to(dtype))


@pytest.mark.parametrize("dtype, grad_mode", [(torch.bfloat16, torch.inference_mode), (torch.float32, torch.no_grad)])
def test_fused_blocks_equal_eager_and_leave_model_code(dtype, grad_mode):
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    class_forward = WanTransformerBlock.forward
    model = tiny_model(dtype)
    cases = [tiny_inputs(dtype), tiny_inputs(dtype, batch=1, text=4, frames=1, seed=1)]
    with grad_mode():
        refs = [model(**kw)[0] for kw in cases]
        fx = install_fusions(model, backend="reference")
        rules = [r for r, _, _ in fx.installed]
        assert rules.count("wan_block") == TINY["num_layers"] and rules.count("wan_prompt") == 1
        outs = [[model(**kw)[0] for kw in cases] for _ in range(2)]
        assert fx.remove() == TINY["num_layers"] + 1
        after = model(**cases[0])[0]
    assert WanTransformerBlock.forward is class_forward and all("forward" not in b.__dict__ for b in model.blocks)
    for again in outs:
        assert all(torch.equal(o, r) for o, r in zip(again, refs))
    assert torch.equal(after, refs[0])
    c = fx.counters
    assert c.rejected == 0 and c.forwards_rejected == 0, c.rejections
    verified = {k[0] for k, ok in fx.verifier.state.items() if ok}
    assert {"modulation_f32", "ln_adaln_f32", "gated_residual_f32", "ln_affine_f32", "res_ln_adaln_f32",
            "qk_wan_aten"} <= verified, verified
    not_here = {k[0] for k, ok in fx.verifier.state.items() if not ok}
    assert not_here <= {"qk_wan_fused"}, not_here


def _kv_calls(model) -> list[int]:
    calls = [0]
    for blk in model.blocks:
        for lin in (blk.attn2.to_k, blk.attn2.to_v):
            lin.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_text_kv_made_once_per_prompt_batch(grad_mode):
    model = tiny_model(torch.bfloat16)
    base = tiny_inputs(torch.bfloat16)
    steps = [dict(base, hidden_states=tiny_inputs(torch.bfloat16, seed=10 + i)["hidden_states"],
                  timestep=torch.full((2,), 900.0 - 100 * i)) for i in range(4)]
    with grad_mode():
        refs = [model(**kw)[0] for kw in steps]
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="none")
        calls = _kv_calls(model)
        try:
            with runner.call_scope():  # one pipeline call
                outs = [model(**steps[0])[0]]  # warm-ups (eager) + capture
                made = calls[0]
                outs += [model(**kw)[0] for kw in steps[1:]]
                replay_calls = calls[0] - made
            c = runner.counters
        finally:
            runner.remove()
            fx.remove()
    assert all(torch.equal(o, r) for o, r in zip(outs, refs))
    assert made > 0 and replay_calls == 0  # three replays, no cross-attention K/V GEMM
    assert (c.hits, c.memo_reuses, c.memo_runs) == (3, 3, 0)
