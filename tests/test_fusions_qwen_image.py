"""Qwen-Image lossless fusions on the CPU (reference backend): the fused double-stream block on a
real tiny QwenImageTransformer2DModel leaves its outputs bit-identical with a padded text mask,
every block verified as a whole against its own forward; LayerNorm + modulate, the gated residuals
and the q/k chain (diffusers RMSNorm, the complex RoPE per stream, the joint concatenation: its
plain-contraction variant, the CPU's) verified against eager; the class is untouched."""

from __future__ import annotations

import pytest
import torch

from bcg.fusions import RULES, install_fusions

# conf/model/qwen_image_tiny.yaml's transformer
TINY = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, axes_dims_rope=[4, 6, 6])


def tiny_model(dtype):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**TINY)
    with torch.no_grad():  # RMSNorm weights init to ones: random values exercise them
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, batch=2, text=8, real=5, side=4, seed=0):
    """As QwenImagePipeline calls it: packed latents, a padded text with its mask, img_shapes."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(text) < real).long()[None].repeat(batch, 1)
    return dict(hidden_states=torch.randn(batch, side * side, TINY["in_channels"], generator=g).to(dtype),
                encoder_hidden_states=torch.randn(batch, text, TINY["joint_attention_dim"], generator=g).to(dtype),
                encoder_hidden_states_mask=mask, timestep=torch.full((batch,), 0.7).to(dtype),
                img_shapes=[[(1, side, side)]] * batch, return_dict=False)


@pytest.mark.parametrize("dtype, grad_mode", [(torch.bfloat16, torch.inference_mode), (torch.float32, torch.no_grad)])
def test_fused_blocks_equal_eager_and_leave_model_code(dtype, grad_mode):
    from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

    class_forward = QwenImageTransformerBlock.forward
    model = tiny_model(dtype)
    blocks = list(model.transformer_blocks)
    cases = [tiny_inputs(dtype), tiny_inputs(dtype, batch=1, text=6, real=6, seed=1)]
    with grad_mode():
        refs = [model(**kw)[0] for kw in cases]
        fx = install_fusions(model, backend="reference")
        assert {r for r, _, _ in fx.installed} == {"qwen_image_block"} and len(fx.installed) == len(blocks)
        outs = [[model(**kw)[0] for kw in cases] for _ in range(2)]
        assert fx.remove() == len(blocks)
        after = model(**cases[0])[0]
    assert QwenImageTransformerBlock.forward is class_forward and all("forward" not in b.__dict__ for b in blocks)
    for again in outs:
        assert all(torch.equal(o, r) for o, r in zip(again, refs))
    assert torch.equal(after, refs[0])
    c = fx.counters
    assert c.rejected == 0 and c.forwards_rejected == 0, c.rejections
    assert c.forwards_verified == 2 * len(blocks)
    verified = {k[0] for k, ok in fx.verifier.state.items() if ok}
    assert {"ln_adaln", "gated_res_ln_adaln", "gated_residual", "qk_complex_mean_plain"} <= verified, verified
    not_here = {k[0] for k, ok in fx.verifier.state.items() if not ok}
    assert not_here <= {"qk_complex_mean_fma_ac_ad", "qk_complex_aten_fma_ac_ad"}, not_here


def test_blocks_that_do_not_fit_keep_their_forward():
    model = tiny_model(torch.float32)
    blk = model.transformer_blocks[0]
    assert RULES["qwen_image_block"].check(blk) is None
    blk.img_mod[0] = torch.nn.GELU()
    assert "Sequential(SiLU, Linear)" in RULES["qwen_image_block"].check(blk)
