"""SANA-Video lossless fusions on the CPU (reference backend): SANA's chains bound to the tiny preset's
SanaVideoTransformer3DModel leave its outputs bit-identical (a masked text, two frame counts), every
block verified as a whole; every block's modulation made in one add a forward."""

from __future__ import annotations

import torch

from bcg.fusions import install_fusions

# conf/model/sana_video_tiny.yaml's transformer
TINY = dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=2,
            num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=32,
            mlp_ratio=2.5, patch_size=[1, 2, 2], qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def tiny_model(dtype):
    from diffusers import SanaVideoTransformer3DModel

    torch.manual_seed(0)
    model = SanaVideoTransformer3DModel(**TINY)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, batch=2, text=8, frames=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, text, dtype=torch.long)
    mask[:, 5:] = 0
    return dict(hidden_states=torch.randn(batch, 16, frames, 8, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(batch, text, TINY["caption_channels"], generator=g).to(dtype),
                timestep=torch.full((batch,), 700.0), encoder_attention_mask=mask, return_dict=False)


def test_fused_blocks_equal_eager():
    from diffusers.models.transformers.transformer_sana_video import SanaVideoTransformerBlock

    class_forward = SanaVideoTransformerBlock.forward
    model = tiny_model(torch.bfloat16)
    cases = [tiny_inputs(torch.bfloat16), tiny_inputs(torch.bfloat16, batch=1, frames=1, seed=1)]
    with torch.inference_mode():
        refs = [model(**kw)[0] for kw in cases]
        fx = install_fusions(model, backend="reference")
        assert [r for r, _, _ in fx.installed] == ["sana_video_block"] * TINY["num_layers"]
        outs = [[model(**kw)[0] for kw in cases] for _ in range(2)]
        fx.remove()
    assert SanaVideoTransformerBlock.forward is class_forward
    for again in outs:
        assert all(torch.equal(o, r) for o, r in zip(again, refs))
    c = fx.counters
    assert c.forwards_rejected == 0 and c.forwards_verified == 2 * TINY["num_layers"], c
    verified = {k[0] for k, ok in fx.verifier.state.items() if ok}
    assert {"modulation_video", "ln_adaln", "gated_residual", "res_ln_adaln"} <= verified, verified
    # CPU convs add their bias inside (oneDNN): the cuDNN-order conv chains may differ here, like SANA's
    assert all(r.split()[0] in ("conv_bias_silu", "conv_bias_glu") for r in c.rejections), c.rejections
