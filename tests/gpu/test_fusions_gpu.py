"""Lossless fusions on the GPU: every Triton chain equals eager bit for bit, and so does the whole
fused forward (SANA-1.6B architecture and the tiny Sana), under graph replay.

Run on the GPU machine: `python -m pytest tests/gpu/test_fusions_gpu.py -q -s`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import ops, ops_norm
from bcg.fusions.verify import Verifier
from tests.gpu.test_bcg_gpu import SANA_1600M, TINY, build, cfg_inputs

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float32, torch.float16]


def op_cases(dtype, B=2, N=256, D=2240, heads=70, hidden=5600, side=16):
    """Inputs of every chain at SANA-1.6B's sizes (B rows of N tokens, 512² at N=256)."""
    g = torch.Generator("cuda").manual_seed(0)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    table = r(B, 6, D)
    shift, scale, gate = table.chunk(6, dim=1)[:3]
    lin = nn.Linear(D, D, device="cuda", dtype=dtype)
    conv_in = nn.Conv2d(D, 2 * hidden, 1, device="cuda", dtype=dtype)
    conv_dw = nn.Conv2d(2 * hidden, 2 * hidden, 3, 1, 1, groups=2 * hidden, device="cuda", dtype=dtype)
    x_cl = r(B, side * side, D).unflatten(1, (side, side)).permute(0, 3, 1, 2)  # as the block makes it
    d_cl = r(B, 2 * hidden, side, side).contiguous(memory_format=torch.channels_last)
    strided = r(B, D, N).transpose(1, 2)  # linear attention's output layout
    with torch.no_grad():
        y_in = conv_in(x_cl)
    return [
        (ops.ADALN, (r(B, N, D), scale, shift)),
        (ops.GATED_RESIDUAL, (r(B, N, D), gate, r(B, N, D))),
        (ops.GATED_RESIDUAL_LINEAR, (r(B, N, D), gate, strided, lin)),
        (ops.LINEAR_ATTENTION, (r(B, N, D), r(B, N, D), r(B, N, D), heads)),
        (ops.LINEAR_ATTENTION_FMA, (r(B, N, D), r(B, N, D), r(B, N, D), heads)),
        (ops.CONV_BIAS_SILU, (x_cl, conv_in)),
        (ops.CONV_BIAS_GLU, (y_in, conv_dw)),
        (ops.GLU, (d_cl,)),
        (ops.RESCALE_RESIDUAL, (r(B, N, D), 1.0, r(B, N, D))),
        (ops.DWCONV_GLU_ROWS, (y_in, conv_dw)),
        (ops.DWCONV_GLU_COLS, (y_in, conv_dw)),
        (ops.MODULATION, (r(20, 6, D, scale=0.1), r(B, 6 * D), B)),  # SANA-1.6B's 20 blocks at once
    ]


# Our depthwise kernel sums the 9 taps in a guessed order (cuDNN's is not documented): one of the
# two orders may differ from cuDNN, which the verifier then rejects (the GLU chain runs instead).
GUESSES = ("dwconv_glu_rows", "dwconv_glu_cols")


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_chain_is_bit_exact(dtype):
    fx = Verifier("triton")
    with torch.no_grad():
        for op, args in op_cases(dtype):
            first = fx.call(op, *args)  # verifies
            again = fx.call(op, *args)  # fused (if verified)
            assert torch.equal(again, first) and again.stride() == first.stride(), op.name
    c = fx.counters
    print(f"\n[fusions {dtype}] {c.as_dict()}")
    assert all(r.split()[0] in GUESSES for r in c.rejections), c.rejections
    assert c.verified >= 10 and c.verified + c.rejected == 12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,N", [(2, 1024), (16, 256), (16, 1024), (32, 1024), (16, 4096)])
def test_two_kernel_linear_attention_equals_cublas_at_the_jobs_batches(dtype, B, N):
    """kernels_linear's FMA chains against eager's cuBLAS products at SANA-1.6B's width, at the rows a
    batch of 1, 8 and 16 images makes with CFG (cuBLAS changes its fp32 kernels with the batch: an FFMA
    tile, then MAGMA's sgemm for the second product at 16 rows and more)."""
    g = torch.Generator("cuda").manual_seed(B + N)
    q, k, v = ((torch.randn(B, N, 2240, generator=g, device="cuda") * 2).to(dtype) for _ in range(3))
    with torch.no_grad():
        want = ops.LINEAR_ATTENTION.eager(q, k, v, 70)
        got = ops.LINEAR_ATTENTION_FMA.fused(q, k, v, 70)
    assert got.stride() == want.stride()
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [2240, 32, 1152])
def test_layer_norm_chain_equals_aten(dtype, D):
    """The fused LN + adaLN kernel reproduces aten's CUDA LayerNorm + the three adaLN ops on every
    input (outlier channels, several row counts), alone, after the residual add and after the gated
    residual (x + gate * a)."""
    from bcg.fusions import kernels_norm  # Triton: GPU machines only

    norm = nn.LayerNorm(D, eps=1e-6, elementwise_affine=False).cuda()
    bad = []
    with torch.no_grad():
        for seed, (B, N) in enumerate([(2, 256), (2, 1024), (8, 77), (1, 1)]):
            g = torch.Generator("cuda").manual_seed(seed)
            x = torch.randn(B, N, D, generator=g, device="cuda")
            x[..., ::7] *= 30
            x = (x + 0.5).to(dtype)
            a = (torch.randn(B, N, D, generator=g, device="cuda") * 0.1).to(dtype)
            sc = (torch.randn(B, 1, D, generator=g, device="cuda") * 0.2).to(dtype)
            sh = (torch.randn(B, 1, D, generator=g, device="cuda") * 0.2).to(dtype)
            want = norm(x) * (1 + sc) + sh
            h2 = a / 1.0 + x
            want_r = norm(h2) * (1 + sc) + sh
            gate = (torch.randn(B, 1, D, generator=g, device="cuda") * 0.3).to(dtype)
            h3 = x + gate * a  # the feed-forward's residual, then the next block's norm1
            want_g = norm(h3) * (1 + sc) + sh
            got = kernels_norm.ln_adaln(x, 1e-6, sc, sh)
            r, got_r = kernels_norm.ln_adaln(a, 1e-6, sc, sh, residual=x)
            rg, got_g = kernels_norm.ln_adaln(a, 1e-6, sc, sh, residual=x, gate=gate)
            for what, g_, w_ in (("ln_adaln", got, want), ("residual", r, h2), ("res_ln_adaln", got_r, want_r),
                                 ("gated residual", rg, h3), ("gated_res_ln_adaln", got_g, want_g)):
                if not torch.equal(g_, w_):
                    bad.append(f"{what} {B}x{N}: {int((g_ != w_).sum())} of {w_.numel()} differ, "
                               f"max {float((g_.float() - w_.float()).abs().max()):.3g}")
    assert not bad, bad


def _check_model(model, cases, policy="none", **cfg):
    with torch.no_grad():
        refs = [model(**kw)[0] for kw in cases]
        runner = apply_graph_runner(model, RunnerConfig(fusions="lossless", **cfg), break_policy=policy)
        try:
            assert runner.mode == "cuda" and runner.fusions is not None
            outs = [model(**kw)[0] for kw in cases]
            again = [model(**kw)[0] for kw in cases]
            stats = runner.stats()
        finally:
            runner.remove()
        assert "forward" not in model.transformer_blocks[0].__dict__
        after = model(**cases[0])[0]
    print(f"\n[fusions model] {stats['fusions']}")
    for i, (ref, out, out2) in enumerate(zip(refs, outs, again)):
        assert torch.equal(out, ref), (i, (out.float() - ref.float()).abs().max().item())
        assert torch.equal(out2, ref), i
    assert torch.equal(after, refs[0])
    return stats["fusions"]


def test_sana_1600m_fused_forward_equals_eager():
    model = build(SANA_1600M, torch.bfloat16)
    cases = [cfg_inputs(SANA_1600M, torch.bfloat16, batch=1, side=16, text=300, real=47),
             cfg_inputs(SANA_1600M, torch.bfloat16, batch=1, side=32, text=300, real=47, seed=1),
             cfg_inputs(SANA_1600M, torch.bfloat16, batch=4, side=16, text=300, real=47, seed=2)]
    fx = _check_model(model, cases)
    assert fx["modules"] == SANA_1600M["num_layers"] + 2  # the blocks, the caption path's two modules
    rejected = {r.split()[0] for r in fx["rejections"]}
    assert rejected <= set(GUESSES), fx["rejections"]
    assert not rejected & set(ops_norm.OP_NAMES), fx["rejections"]  # the norm kernels equal aten's
    assert fx["fused_calls"] > 0 and fx["unverified_in_capture"] == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", ["none", "attention"])
def test_tiny_sana_fused_forward_equals_eager(dtype, policy):
    model = build(TINY, dtype)
    cases = [cfg_inputs(TINY, dtype, seed=s) for s in range(2)]
    fx = _check_model(model, cases, policy)
    assert fx["modules"] == TINY["num_layers"] + 2


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("config", ["tiny", "1600m"])
def test_prompt_state_is_made_once_per_prompt_batch(config, grad_mode):
    """The denoising loop's shape: new latents and timestep each step, one prompt batch for four
    steps (then a second batch). Every step equals eager, bit for bit, while the caption path and
    the cross-attention K/V (bcg/fusions/sana_prompt.py) ran once per batch, not once per step.
    inference_mode is the job's: inference tensors have no version counter, the call scope counts."""
    cfg = TINY if config == "tiny" else SANA_1600M
    model = build(cfg, torch.bfloat16)
    side, text = (8, 12) if config == "tiny" else (32, 300)
    batches = []
    for b in range(2):
        base = cfg_inputs(cfg, torch.bfloat16, side=side, text=text, real=5, seed=10 * b)
        batches.append([dict(base, hidden_states=cfg_inputs(cfg, torch.bfloat16, side=side, text=text,
                                                             seed=10 * b + i + 1)["hidden_states"],
                             timestep=base["timestep"] - 40 * i) for i in range(4)])
    with grad_mode():
        refs = [[model(**kw)[0] for kw in steps] for steps in batches]
        runner = apply_graph_runner(model, RunnerConfig(fusions="lossless"), break_policy="none")
        try:
            outs = []
            for steps in batches:
                with runner.call_scope():
                    outs.append([model(**kw)[0] for kw in steps])
            c = runner.counters
        finally:
            runner.remove()
    for b, (want, got) in enumerate(zip(refs, outs)):
        for i, (r, o) in enumerate(zip(want, got)):
            assert torch.equal(o, r), (b, i, (o.float() - r.float()).abs().max().item())
    # batch 0: capture + 3 replays (reused); batch 1: 4 replays, the first re-runs the memo
    assert (c.captures, c.hits, c.memo_runs, c.memo_reuses) == (1, 7, 1, 6), c


def test_key_first_seen_in_capture_runs_eager():
    """warmup_iters=0: the capture is the first sight; nothing is verified inside it (each block runs
    its own forward there: bcg/fusions/guard.py)."""
    model = build(TINY, torch.bfloat16)
    fx = _check_model(model, [cfg_inputs(TINY, torch.bfloat16)], warmup_iters=0)
    assert fx["forwards_unverified_in_capture"] > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,side", [(2, 16), (2, 32), (16, 32), (3, 13)])
def test_dw_rows_tiles_equal_eager(dtype, rows, side):
    """The row walk the job runs (SANA-1.6B's 2 x 5,600 channels; CFG rows at batch 1 and 8, 512² and
    1024², and an odd grid) gives eager's bits (cuDNN's depthwise conv with its bias, then the GLU):
    its taps as FMAs (the default) or as separate multiplies and adds (products of bf16 / fp16 values
    are exact in fp32: kernels._taps3w), and with its loads software-pipelined through shared memory
    (2 to 4 stages). Inputs as the block makes them: SiLU'd, with a few large outliers."""
    import torch.nn.functional as F

    from bcg.fusions import kernels

    g = torch.Generator("cuda").manual_seed(rows * side)
    C2 = 2 * 5600
    conv = nn.Conv2d(C2, C2, 3, 1, 1, groups=C2, device="cuda", dtype=dtype)
    raw = torch.randn(rows, side, side, C2, generator=g, device="cuda") * 3
    raw[..., ::997] *= 40  # outlier channels
    x = F.silu(raw).to(dtype).permute(0, 3, 1, 2)  # channels-last, as the block makes it
    bad = []
    with torch.no_grad():
        want = ops.DWCONV_GLU_ROWS.eager(x, conv)  # the module's conv (cuDNN, its bias), then the GLU
        default = kernels.dw_rows_tile(side, rows)
        assert default[5] is True  # the default tile's taps are FMAs
        for tile in (None, default[:5] + (False,), (8, 32, 64, 8, True, True), (8, 32, 64, 8, True, False),
                     default[:6] + (1,), default[:4] + (False, True, 3), default[:4] + (True, True, 2),
                     (16, 32, 64, 8, False, True, 4)):
            got = kernels.dwconv_glu_rows(x, conv.weight, conv.bias, tile)
            if not (torch.equal(got, want) and got.stride() == want.stride()):
                bad.append(f"tile {tile}: {int((got != want).sum())} of {want.numel()} differ")
    assert not bad, bad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("side", [16, 32, 13])
def test_silu_dwconv_glu_equals_eager(dtype, side):
    """GLUMBConv's input half in one kernel after the 1x1 conv (SANA-1.6B widths, CFG's 2 rows at
    512² and 1024², and an odd grid) equals eager's silu(conv_inverted) -> conv_depth -> GLU, for
    the default tile and both shift modes."""
    import torch.nn.functional as F

    from bcg.fusions import kernels

    g = torch.Generator("cuda").manual_seed(side)
    D, hidden = 2240, 5600
    conv_in = nn.Conv2d(D, 2 * hidden, 1, device="cuda", dtype=dtype)
    conv_dw = nn.Conv2d(2 * hidden, 2 * hidden, 3, 1, 1, groups=2 * hidden, device="cuda", dtype=dtype)
    x = (torch.randn(2, side * side, D, generator=g, device="cuda") * 3).to(dtype)
    x = x.unflatten(1, (side, side)).permute(0, 3, 1, 2)  # as the block makes it
    bad = []
    with torch.no_grad():
        want = ops.SILU_DWCONV_GLU.eager(x, conv_in, conv_dw)
        raw = F.conv2d(x, conv_in.weight, None)
        for tile in (None, (8, 32, 32, 4, False), (4, 32, 64, 8, True), (32, 32, 32, 4, True)):
            got = kernels.silu_dwconv_glu(raw, conv_in.bias, conv_dw.weight, conv_dw.bias, tile)
            if not (torch.equal(got, want) and got.stride() == want.stride()):
                bad.append(f"tile {tile}: {int((got != want).sum())} of {want.numel()} differ")
        assert torch.equal(ops.SILU_DWCONV_GLU.fused(x, conv_in, conv_dw), want)
    assert not bad, bad
