"""Z-Image lossless fusions on the CPU (no Triton): each chain's rounding plan (`reference`, what the
kernels in bcg/fusions/kernels_rms.py compute around aten's RMSNorm mean) equals eager bit for
bit in bf16 and fp32; the block forward installed on a real tiny ZImageTransformer2DModel leaves its
outputs identical and its class untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bcg.fusions import install_fusions, ops_act, ops_rms
from bcg.fusions.registry import RULES
from bcg.fusions.verify import Verifier

DTYPES = [torch.bfloat16, torch.float32]
# conf/model/z_image_tiny.yaml's transformer, with 2 refiner layers of each kind
TINY = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1,
            n_heads=2, n_kv_heads=2, cap_feat_dim=32, axes_dims=[4, 6, 6], axes_lens=[1024, 64, 64])


def _rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


def _norm(dim, dtype, eps=1e-5):
    from diffusers.models.normalization import RMSNorm

    n = RMSNorm(dim, eps=eps)
    with torch.no_grad():
        n.weight.copy_(1 + 0.3 * torch.randn(dim))
    return n.to(dtype)


def _freqs(B, N, half):
    ang = torch.rand(B, N, half) * 40
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64)


def cases(dtype, B=2, N=24, D=48, heads=3):
    """Inputs of every chain, at the block's layouts: modulation [B, 1, D], q/k [B, N, heads, D/heads]."""
    mod = _rand(B, 4 * D, dtype=dtype)
    scale, gate, scale2, gate2 = mod.unsqueeze(1).chunk(4, dim=2)
    gate, scale = gate.tanh(), 1.0 + scale
    hd = D // heads
    n1, n2, nq = _norm(D, dtype), _norm(D, dtype), _norm(hd, dtype)
    x, y = _rand(B, N, D, dtype=dtype, scale=3.0), _rand(B, N, D, dtype=dtype, scale=0.2)
    q = _rand(B, N, D, dtype=dtype).unflatten(-1, (heads, -1))
    plain_rope = ops_rms.NORM_ROPE[ops_rms.NORM_ROPE_MODES.index("plain")]
    var = ops_rms.RMS_VARIANCE[-1].reference  # aten's mean of the squares (the CPU's plan)
    return [
        (ops_rms.RMS_VARIANCE[-1], (x,)),
        (ops_rms.RMS_SCALE, (x, var(x), n1, n1.eps, scale)),
        (ops_rms.RMS_SCALE, (x, var(x), n1, n1.eps, None)),
        (ops_rms.RMS_RESIDUAL, (x, gate, y, var(y), n2, n2.eps)),
        (ops_rms.RMS_RESIDUAL, (x, None, y, var(y), n2, n2.eps)),
        (plain_rope, (q, var(q), nq, nq.eps, _freqs(B, N, hd // 2))),
        (ops_act.SWIGLU, (_rand(B, N, 2 * D, dtype=dtype, scale=4.0), _rand(B, N, 2 * D, dtype=dtype))),
    ]


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) and a.stride() == b.stride() and a.dtype == b.dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_plans_equal_eager(dtype):
    torch.manual_seed(0)
    with torch.no_grad():
        for op, args in cases(dtype):
            assert _same(op.reference(*args), op.eager(*args)), op.name


def test_gpu_orders_are_left_to_the_gpu():
    """The complex product's FMA variants and aten's CUDA reduction orders have no plain-torch plan:
    on the CPU they do not apply (eager runs), and the verifier counts them as such, not as rejections."""
    torch.manual_seed(0)
    fx = Verifier("reference")
    q = _rand(1, 8, 2, 16, dtype=torch.bfloat16)
    nq = _norm(16, torch.bfloat16)
    with torch.no_grad():
        var = ops_rms.RMS_VARIANCE[-1].eager(q)
        for op in ops_rms.RMS_VARIANCE:
            assert torch.equal(fx.call(op, q), var)
        args = (q, var, nq, nq.eps, _freqs(1, 8, 8))
        for op in ops_rms.NORM_ROPE:
            assert torch.equal(fx.call(op, *args), ops_rms.NORM_ROPE[0].eager(*args))
    c = fx.counters
    n_gpu_only = len(ops_rms.NORM_ROPE) + len(ops_rms.RMS_VARIANCE) - 2
    assert (c.not_applicable, c.verified, c.rejected) == (n_gpu_only, 2, 0)


def test_norms_that_do_not_fit_the_plan_run_eager():
    x = _rand(1, 4, 8, dtype=torch.bfloat16)
    n32 = _norm(8, torch.float32)  # fp32 weight on a bf16 input: eager's output is fp32
    fx = Verifier("reference")
    with torch.no_grad():
        var = ops_rms.RMS_VARIANCE[-1].eager(x)
        out = fx.call(ops_rms.RMS_SCALE, x, var, n32, n32.eps, None)
        assert _same(out, n32(x)) and out.dtype == torch.float32
        ln = nn.LayerNorm(8).to(torch.bfloat16)
        ln.eps, ln.bias = 1e-5, None
        assert _same(fx.call(ops_rms.RMS_SCALE, x, var, ln, 1e-5, None), ln(x))
    assert fx.counters.not_applicable == 2 and fx.counters.rejected == 0


def tiny_z_image(dtype):
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    model = ZImageTransformer2DModel(**TINY)
    with torch.no_grad():  # diffusers initialises these to ones / zeros: random values exercise them
        for name, p in model.named_parameters():
            if "norm" in name or "pad_token" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def tiny_inputs(dtype, caps=(7, 12), seed=0):
    """A CFG-like batch: one latent per row, captions of different lengths (the attention mask path)."""
    g = torch.Generator().manual_seed(seed)
    x = [torch.randn(4, 1, 8, 8, generator=g).to(dtype) for _ in caps]
    cap = [torch.randn(n, TINY["cap_feat_dim"], generator=g).to(dtype) for n in caps]
    return dict(x=x, t=torch.tensor([0.3] * len(caps)).to(dtype), cap_feats=cap, return_dict=False)


def _run(model, kw):
    return torch.stack(model(**kw)[0])


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("dtype", DTYPES)
def test_install_and_remove_leave_model_code_and_outputs(dtype, grad_mode):
    from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

    class_forward = ZImageTransformerBlock.forward
    model = tiny_z_image(dtype)
    blocks = [m for m in model.modules() if isinstance(m, ZImageTransformerBlock)]
    assert len(blocks) == TINY["n_layers"] + 2 * TINY["n_refiner_layers"]
    batches = [tiny_inputs(dtype), tiny_inputs(dtype, caps=(9,), seed=1)]
    with grad_mode():
        refs = [_run(model, kw) for kw in batches]
        fx = install_fusions(model, backend="reference")
        assert len(fx.installed) == len(blocks) and {r for r, _, _ in fx.installed} == {"z_image_block"}
        outs = [[_run(model, kw) for kw in batches] for _ in range(2)]  # first sight verifies, then fused
        assert fx.remove() == len(blocks)
        after = _run(model, batches[0])
    assert ZImageTransformerBlock.forward is class_forward
    assert all("forward" not in b.__dict__ for b in blocks)
    for again in outs:
        assert all(torch.equal(o, r) for o, r in zip(again, refs))
    assert torch.equal(after, refs[0])
    c = fx.counters
    assert c.rejected == 0, c.rejections
    assert c.verified >= 5 and c.fused_calls > 0 and c.unverified_in_capture == 0


def test_blocks_that_do_not_fit_keep_their_forward():
    model = tiny_z_image(torch.float32)
    rule = RULES["z_image_block"]
    blk = model.layers[0]
    assert rule.check(blk) is None
    blk.feed_forward._forward_silu_gating = lambda a, b: a * b  # someone's own gating
    assert "FeedForward" in rule.check(blk)
    del blk.feed_forward._forward_silu_gating
    blk.train()
    assert "training" in rule.check(blk)
