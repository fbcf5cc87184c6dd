"""Flux.1 and LongCat-Image lossless fusions on the CPU (reference backend): the fused double- and
single-stream forwards installed on real tiny diffusers models leave their outputs bit-identical,
every block verified as a whole against its own forward, the shared chains verified against eager
(LayerNorm + adaLN, gated residuals, q/k RoPE into the joint concatenation) and the GPU-only ones
(aten's fused RMSNorm order, CUDA GELU-tanh) not applicable here; the model's classes are untouched."""

from __future__ import annotations

import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import RULES, install_fusions

# conf/model/flux_tiny.yaml and longcat_image_tiny.yaml's transformers, 2 + 2 layers (the second
# single-stream block receives the first's output as two views of one tensor)
TINY = {
    "flux": ("FluxTransformer2DModel", dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                            pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=[4, 6, 6])),
    "longcat_image": ("LongCatImageTransformer2DModel",
                      dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
                           num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                           axes_dims_rope=[4, 6, 6])),
}


def tiny_model(family: str, dtype):
    import diffusers

    cls, cfg = TINY[family]
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**cfg)
    with torch.no_grad():  # RMSNorm weights init to ones: random values exercise them
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(family: str, dtype, batch=2, text=7, side=4, seed=0):
    """Inputs as the pipelines build them: packed latents, text, position ids, timestep."""
    _, cfg = TINY[family]
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1] += torch.arange(side)[:, None]
    img_ids[..., 2] += torch.arange(side)[None, :]
    kw = dict(hidden_states=torch.randn(batch, side * side, cfg["in_channels"], generator=g).to(dtype),
              encoder_hidden_states=torch.randn(batch, text, cfg["joint_attention_dim"], generator=g).to(dtype),
              timestep=torch.full((batch,), 0.6).to(dtype), img_ids=img_ids.reshape(-1, 3),
              txt_ids=torch.zeros(text, 3), return_dict=False)
    if family == "flux":
        kw.update(pooled_projections=torch.randn(batch, cfg["pooled_projection_dim"], generator=g).to(dtype),
                  guidance=torch.full((batch,), 3.5))
    else:
        kw["txt_ids"][:, 1:] = torch.arange(text)[:, None].float()
        kw["img_ids"][:, 1:] += text
    return kw


def _blocks(model):
    return list(model.transformer_blocks) + list(model.single_transformer_blocks)


# each family in both dtypes and both grad modes (the job runs under inference_mode), four runs in all
@pytest.mark.parametrize("family, dtype, grad_mode", [
    ("flux", torch.bfloat16, torch.inference_mode), ("flux", torch.float32, torch.no_grad),
    ("longcat_image", torch.bfloat16, torch.no_grad), ("longcat_image", torch.float32, torch.inference_mode)])
def test_fused_blocks_equal_eager_and_leave_model_code(family, dtype, grad_mode):
    model = tiny_model(family, dtype)
    double, single = type(model.transformer_blocks[0]), type(model.single_transformer_blocks[0])
    forwards = (double.forward, single.forward)
    cases = [tiny_inputs(family, dtype), tiny_inputs(family, dtype, batch=1, text=5, seed=1)]
    with grad_mode():
        refs = [model(**kw)[0] for kw in cases]
        fx = install_fusions(model, backend="reference")
        assert {r for r, _, _ in fx.installed} == {f"{family.replace('_image', 'image')}_block",
                                                   f"{family.replace('_image', 'image')}_single_block"}
        assert len(fx.installed) == len(_blocks(model))
        outs = [[model(**kw)[0] for kw in cases] for _ in range(2)]  # first sight verifies, then fused
        assert fx.remove() == len(_blocks(model))
        after = model(**cases[0])[0]
    assert (double.forward, single.forward) == forwards and all("forward" not in b.__dict__ for b in _blocks(model))
    for again in outs:
        assert all(torch.equal(o, r) for o, r in zip(again, refs))
    assert torch.equal(after, refs[0])
    c = fx.counters
    assert c.rejected == 0 and c.forwards_rejected == 0, c.rejections
    # every block, for both input keys (the second single block: views of the first's output)
    assert c.forwards_verified == 2 * len(_blocks(model))
    verified = {k[0] for k, ok in fx.verifier.state.items() if ok}
    assert {"ln_adaln", "gated_res_ln_adaln", "gated_residual", "qk_pairs_aten"} <= verified, verified
    # GPU-only plans: not applicable here, their fallbacks ran (and equal eager, above)
    not_here = {k[0] for k, ok in fx.verifier.state.items() if not ok}
    assert not_here <= {"qk_pairs_fused", "gelu_tanh_cat_fma", "gelu_tanh_cat_plain"}, not_here


def test_the_second_single_block_reads_the_first_ones_output_without_a_copy():
    from bcg.fusions.flux import _joined

    base = torch.randn(2, 9, 8)
    a, b = base[:, :4], base[:, 4:]
    assert _joined(a, b) is base
    assert torch.equal(_joined(a.clone(), b), torch.cat([a, b], dim=1))
    assert _joined(b, a).data_ptr() != base.data_ptr()  # the other order: a real cat


def test_blocks_with_other_processors_or_kwargs_keep_their_forward():
    model = tiny_model("flux", torch.float32)
    blk = model.transformer_blocks[0]
    assert RULES["flux_block"].check(blk) is None
    blk.attn.processor = type("OtherProcessor", (), {"__call__": lambda *a, **k: None})()
    assert "FluxAttnProcessor" in RULES["flux_block"].check(blk)
    blk.train()
    assert RULES["flux_single_block"].check(model.single_transformer_blocks[0]) is None


def test_fused_flux_captures_and_replays_on_the_tape():
    """Under bcg's CPU op tape (the CUDA graph's stand-in): capture after eager warm-ups, replays,
    every output eager's bits, with the attention kernels as breaks."""
    model = tiny_model("flux", torch.float32)
    cases = [tiny_inputs("flux", torch.float32, seed=s) for s in range(2)]
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
    assert stats["hits"] >= 2 and fx.counters.forwards_unverified_in_capture == 0
    n_attn = len(_blocks(model))
    assert {e["breaks"] for e in stats["entries"]} == {n_attn}
