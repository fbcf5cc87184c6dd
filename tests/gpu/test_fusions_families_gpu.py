"""Lossless fusions of Flux, LongCat-Image, Qwen-Image, Wan, SANA-Video, LTX-2, GLM-Image and MiniMax-H3 on the
GPU: the shared kernels equal aten at the real sizes; the modelled orders and contractions that no CPU can
check are measured (aten's fused RMSNorm order, GELU-tanh's contraction, the affine LayerNorm's FMA); and the
whole fused forward equals eager bit for bit under graph replay, for each family's tiny preset and for its real
architecture cut to 2 + 2 layers, with every block verified as a whole and no rejection outside the
known candidates. (The tiny pipelines, eager against bcg with fusions: test_fusions_z_image_gpu.py's
test_tiny_pipeline_with_fusions_equals_eager, for every family with a rule.)

Run on the GPU machine: `python -m pytest tests/gpu/test_fusions_families_gpu.py -q -s` (~4 min).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import ops, ops_act, ops_norm, ops_rms, ops_rope
from bcg.fusions.verify import Verifier

pytestmark = pytest.mark.gpu

# Chains whose plan is a model of aten still to be proven on a GPU: the verifier may reject them
# (their fallbacks then run). Everything else must verify.
CANDIDATES = {"qk_pairs_fused", "qk_wan_fused", "gelu_tanh_cat_fma", "gelu_tanh_cat_plain", "ln_affine_f32",
              "qk_complex_mean_plain", "qk_complex_aten_plain", "qk_complex_mean_fma_ac_ad",
              # LTX-2: aten's fused RMSNorm order; the split RoPE's two contractions (aten's CUDA addcmul
              # rounds each product: `plain` expected); the RMSNorm variance's orders at rows of 4096 and 2048
              "qk_ltx_interleaved_fused", "qk_ltx_split_fused_plain", "qk_ltx_split_fused_fma_bd_ad",
              "qk_ltx_split_aten_plain", "qk_ltx_split_aten_fma_bd_ad", "rms_variance_vec_dec", "rms_variance_vec_inc",
              # the invariant mode's row order (ops_rms): eager's mean only under bcg.invariant
              "rms_variance_rows"}


def _cuda(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cuda()
    if isinstance(obj, dict):
        return {k: _cuda(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cuda(v) for v in obj)
    return obj


def _g(seed=0):
    return torch.Generator("cuda").manual_seed(seed)


def _rand(*shape, g, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


def _norm(cls, dim, dtype, g, **kw):
    n = cls(dim, **kw).cuda()
    with torch.no_grad():
        if getattr(n, "weight", None) is not None:
            n.weight.copy_(1 + 0.3 * torch.randn(dim, generator=g, device="cuda"))
    return n.to(dtype)


# -- the chains at real sizes --------------------------------------------------------------------------
def chain_cases(dtype):
    """Flux.1-dev at 1024² (512 text + 4096 image tokens, 24 heads of 128, width 3072), Qwen-Image (128 +
    4096 tokens), Wan 2.1 1.3B (1560 tokens of a 480x832 frame pair, 12 heads of 128)."""
    from diffusers.models.normalization import FP32LayerNorm, RMSNorm

    g = _g()
    D = 3072
    ln = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6).cuda()
    x, y = _rand(1, 4608, D, g=g, scale=3, dtype=dtype), _rand(1, 4608, D, g=g, dtype=dtype)
    sc, sh, gt = (_rand(1, 1, D, g=g, scale=0.3, dtype=dtype) for _ in range(3))
    ang = torch.rand(4608, 64, generator=g, device="cuda") * 500
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    qt, qi = _rand(1, 512, 24, 128, g=g, dtype=dtype), _rand(1, 4096, 24, 128, g=g, dtype=dtype)
    tn = [_norm(nn.RMSNorm, 128, dtype, g, eps=1e-6) for _ in range(2)]
    dn = [_norm(RMSNorm, 128, dtype, g, eps=1e-6) for _ in range(2)]
    fq = [torch.polar(torch.ones(n, 64, device="cuda"), torch.rand(n, 64, generator=g, device="cuda") * 500)
          for n in (128, 4096)]
    qq = (_rand(1, 128, 24, 128, g=g, dtype=dtype), qi)
    cases = [(ops.ADALN, (x, sc, sh)), (ops.GATED_RESIDUAL, (x, gt, y)),
             (ops_norm.LN_ADALN, (x, ln, sc, sh)), (ops_norm.GRES_LN_ADALN, (y, gt, x, ln, sc, sh)),
             (ops_act.GELU_CAT[0], (y, _rand(1, 4608, 4 * D, g=g, scale=3, dtype=dtype), nn.GELU(approximate="tanh"))),
             (ops_act.GELU_CAT[1], (y, _rand(1, 4608, 4 * D, g=g, scale=3, dtype=dtype), nn.GELU(approximate="tanh")))]
    cases += [(op, ((qt, qi), tuple(tn), (cos, sin))) for op in ops_rope.QK_PAIRS]
    cases += [(op, ((qi,), (tn[1],), (cos[:4096], sin[:4096]))) for op in ops_rope.QK_PAIRS]  # single-stream
    cases += [(op, (qq, tuple(dn), tuple(fq))) for op in ops_rope.QK_COMPLEX]
    # Wan 2.1 1.3B: 1536 wide, fp32 modulation
    W = 1536
    h, a = _rand(2, 1560, W, g=g, scale=3, dtype=dtype), _rand(2, 1560, W, g=g, dtype=dtype)
    s32, t32, g32 = (torch.randn(2, 1, W, generator=g, device="cuda") * 0.3 for _ in range(3))
    f1 = FP32LayerNorm(W, 1e-6, elementwise_affine=False).cuda()
    f2 = _norm(FP32LayerNorm, W, dtype, g, eps=1e-6, elementwise_affine=True)
    with torch.no_grad():
        f2.bias.copy_(0.1 * torch.randn(W, generator=g, device="cuda"))
    wn = _norm(nn.RMSNorm, W, dtype, g, eps=1e-6)
    wang = torch.rand(1560, 64, generator=g, device="cuda") * 500
    wcos = wang.cos().repeat_interleave(2, -1)[None, :, None]
    wsin = wang.sin().repeat_interleave(2, -1)[None, :, None]
    cases += [(ops_norm.LN_ADALN_F32, (h, f1, s32, t32)), (ops_norm.RES_LN_ADALN_F32, (a, h, f1, s32, t32)),
              (ops_norm.LN_AFFINE_F32, (h, f2)), (ops.GATED_RESIDUAL_F32, (h, g32, a)),
              (ops.MODULATION_F32, (torch.randn(30, 1, 6, W, device="cuda", generator=g).to(dtype),
                                    torch.randn(2, 6, W, device="cuda", generator=g).to(dtype)))]
    cases += [(op, (_rand(2, 1560, W, g=g, dtype=dtype), wn, 12, (wcos, wsin))) for op in ops_rope.QK_WAN]
    # GLM-Image at 1024x1024, the CFG pair's batch (16 glyph + 4096 image tokens, 64 heads of 40): the
    # per-head LayerNorm, then rotate-half on the image slice; a table whose halves differ (the rule
    # rotates each half with its own, so it must be exact for any values) and the model's own
    gq = _rand(2, 16 + 4096, 64, 40, g=g, scale=3, dtype=dtype)
    gln = nn.LayerNorm(40, elementwise_affine=False, eps=1e-5).cuda()
    gang = torch.rand(4096, 40, generator=g, device="cuda") * 100
    own = torch.cat([gang[:, :20], gang[:, :20]], -1)
    for table in (gang, own):
        cases += [(op, (gq, gln, 16, (table.cos(), table.sin()))) for op in ops_rope.QK_GLM]
    return cases


def ltx2_chain_cases(dtype):
    """LTX-2 at 480x832x49 (2730 video tokens, 4096 wide, 32 heads of 128; 51 audio tokens, 2048 wide,
    32 heads of 64), the CFG batch of 2: its RMSNorm (no weight) + adaLN after aten's variance, the
    gated residual, every block's modulation in one add, and q/k norm + RoPE, split (a set of
    frequencies a head, laid out as LTX2AudioVideoRotaryPosEmbed makes them) and interleaved."""
    from diffusers.models.normalization import RMSNorm

    g = _g(7)
    cases = []
    for W, N, heads in ((4096, 2730, 32), (2048, 51, 32)):
        x, y = _rand(2, N, W, g=g, scale=3, dtype=dtype), _rand(2, N, W, g=g, dtype=dtype)
        sc, sh, gt = (_rand(2, 1, W, g=g, scale=0.3, dtype=dtype) for _ in range(3))
        norm = RMSNorm(W, eps=1e-6, elementwise_affine=False).cuda()
        var = x.float().pow(2).mean(-1, keepdim=True)  # what eager's norm reduces (aten's mean)
        cases += [(ops_rms.RMS_ADALN, (x, var, norm, 1e-6, sc, sh)),
                  (ops_rms.RMS_ADALN, (x, var, norm, 1e-6, None, None)), (ops.GATED_RESIDUAL, (x, gt, y))]
        cases += [(op, (x,)) for op in ops_rms.RMS_VARIANCE if "strided" not in op.name]  # those: rows of 128
        qn = _norm(nn.RMSNorm, W, dtype, g, eps=1e-6)
        ang = torch.rand(2, N, heads, W // heads // 2, generator=g, device="cuda") * 50
        split = (ang.cos().transpose(1, 2), ang.sin().transpose(1, 2))  # [B, H, S, D/2], LTX-2's layout
        cases += [(op, (x, qn, split)) for op in ops_rope.QK_LTX_SPLIT]
        whole = torch.rand(2, N, W // 2, generator=g, device="cuda") * 50
        inter = (whole.cos().repeat_interleave(2, -1), whole.sin().repeat_interleave(2, -1))
        cases += [(op, (x, qn, inter)) for op in ops_rope.QK_LTX]
    tables = torch.randn(48, 6, 4096, generator=g, device="cuda").to(dtype)
    cases.append((ops.MODULATION_VIDEO, (tables, torch.randn(2, 1, 6 * 4096, generator=g, device="cuda").to(dtype), 2)))
    return cases


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ltx2_chains_are_bit_exact_at_real_sizes(dtype):
    fx = Verifier("triton", cache=None)
    verdicts: dict[str, bool] = {}
    with torch.no_grad():
        for op, args in ltx2_chain_cases(dtype):
            want = op.eager(*args)
            first, again = fx.call(op, *args), fx.call(op, *args)
            assert torch.equal(first, want) and torch.equal(again, want) and again.stride() == want.stride(), op.name
            verdicts[op.name] = verdicts.get(op.name, True) and bool(fx.state.get(fx.key(op, args)))
    verified = {k for k, v in verdicts.items() if v}
    print(f"\n[LTX-2 chains {dtype}] verified: {sorted(verified)}; rejected: {fx.counters.rejections}; "
          f"not applicable {fx.counters.not_applicable}")
    must = {k for k in verdicts if k not in CANDIDATES}
    assert must <= verified, must - verified
    # the split RoPE after aten's norm: aten's addcmul is an FMA (fma_bd_ad); over 22M outputs the
    # rounded-products plan must differ somewhere, or this case could not tell the two apart
    assert "qk_ltx_split_aten_fma_bd_ad" in verified and verdicts["qk_ltx_split_aten_plain"] is False, verdicts
    assert "qk_ltx_interleaved_aten" in verified


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_chain_is_bit_exact_at_real_sizes(dtype):
    fx = Verifier("triton", cache=None)
    verdicts = {}
    with torch.no_grad():
        for op, args in chain_cases(dtype):
            want = op.eager(*args)
            first = fx.call(op, *args)
            again = fx.call(op, *args)
            for w, a, b in zip(*(t if isinstance(t, tuple) else (t,) for t in (want, first, again))):
                assert torch.equal(a, w) and torch.equal(b, w) and b.stride() == w.stride(), op.name
            verdicts[op.name] = verdicts.get(op.name, True) and bool(fx.state.get(fx.key(op, args)))
    print(f"\n[family chains {dtype}] verified: {sorted(k for k, v in verdicts.items() if v)}; "
          f"rejected: {fx.counters.rejections}; not applicable {fx.counters.not_applicable}")
    must = {k for k in verdicts if k not in CANDIDATES}
    assert all(verdicts[k] for k in must), {k: verdicts[k] for k in must if not verdicts[k]}


def test_fused_rms_norm_order_against_aten():
    """How close kernels_rms.fused_rms_rstd's model is to aten's `_fused_rms_norm` (torch.nn.RMSNorm on
    CUDA): per head (rows of 128: Flux, LongCat) and across heads (1536, 5120: Wan 1.3B / 14B), each form
    (FMA in the sum of squares or not; Triton's tree or the spelled-out one). Triton's tree must equal the
    spelled-out tree (the order claim); the forms' mismatch counts are printed."""
    from bcg.fusions import kernels_rope as KR

    found = {}
    for L, heads in ((128, 1), (1536, 12), (5120, 40)):
        g = _g(L)
        x = _rand(2, 1024, heads, L // heads, g=g, scale=3)
        w = 1 + 0.3 * torch.randn(L, generator=g, device="cuda")
        want = F.rms_norm(x.reshape(2, 1024, L), (L,), w.to(x.dtype), 1e-6).view_as(x)
        one = torch.ones(1, 1024, L // heads, device="cuda")
        zero = torch.zeros_like(one)
        for sq_fma in (True, False):
            outs = {}
            for explicit in (False, True):
                KR.EXPLICIT_TREE = explicit
                try:
                    outs[explicit] = KR.rope(x, (one, zero), KR.Rope("pairs"), norm="fused", weight=w.to(x.dtype),
                                             eps=1e-6, across_heads=heads > 1, sq_fma=sq_fma)
                finally:
                    KR.EXPLICIT_TREE = False
            assert torch.equal(outs[False], outs[True]), (L, sq_fma)
            found[(L, sq_fma)] = int((outs[False] != want).sum())
    print(f"\n[fused RMSNorm order] elements differing from F.rms_norm (row length, FMA): {found}")


def test_head_rows_kernel_equals_eager_at_real_sizes():
    """kernels_rope._head_rows_kernel (q/k RMSNorm + RoPE for heads of 128, the default for them) against
    eager's own modules at Qwen-Image's and Flux's 1024² image streams, bit for bit, and against the
    general kernels it replaced; written into a joint tensor at a token offset, the rest untouched."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    from bcg.fusions import kernels_rope as KR

    assert KR.HEAD_KERNEL
    g = _g(7)
    S, H, D, t0 = 4096, 24, 128, 512
    x = _rand(1, S, H, D, g=g, scale=3)
    ang = torch.rand(S, D // 2, generator=g, device="cuda") * 30
    qwen_norm, flux_norm = _norm(RMSNorm, D, torch.bfloat16, g, eps=1e-6), _norm(nn.RMSNorm, D, torch.bfloat16, g,
                                                                                 eps=1e-6)
    freqs = torch.polar(torch.ones_like(ang), ang)
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    cases = {
        "qwen mean complex": (apply_rotary_emb_qwen(qwen_norm(x), freqs, use_real=False),
                              lambda out: KR.rope(x, freqs[None], KR.Rope("complex", "fma_ac_ad"), out, t0, norm="mean",
                                                  weight=qwen_norm.weight, eps=1e-6)),
        "flux fused pairs": (apply_rotary_emb(flux_norm(x), (cos, sin), sequence_dim=1),
                             lambda out: KR.rope(x, (cos[None], sin[None]), KR.Rope("pairs"), out, t0, norm="fused",
                                                 weight=flux_norm.weight, eps=1e-6)),
    }
    for name, (want, fused) in cases.items():
        outs = {}
        for head in (True, False):
            KR.HEAD_KERNEL = head
            try:
                joint = torch.full((1, S + t0, H, D), 7.0, device="cuda", dtype=torch.bfloat16)
                fused(joint)
            finally:
                KR.HEAD_KERNEL = True
            assert torch.all(joint[:, :t0] == 7.0), name
            outs[head] = joint[:, t0:]
        assert torch.equal(outs[True], want), (name, int((outs[True] != want).sum()))
        assert torch.equal(outs[True], outs[False]), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gelu_tanh_forms_against_aten(dtype):
    from bcg.fusions import kernels_act as KA

    x = _rand(1 << 22, g=_g(), scale=4, dtype=dtype).view(1, 1, -1)
    want = F.gelu(x, approximate="tanh")
    diffs = {fma: int((KA.gelu_cat(None, x, gelu_fma=fma) != want).sum()) for fma in (True, False)}
    print(f"\n[gelu tanh {dtype}] elements differing per form (fma): {diffs}")
    assert min(diffs.values()) == 0, diffs


# -- whole models ----------------------------------------------------------------------------------------
def _check_model(model, cases, blocks, run=lambda m, kw: m(**kw)[0]):
    with torch.no_grad():
        refs = [run(model, kw) for kw in cases]
        runner = apply_graph_runner(model, RunnerConfig(fusions="lossless"), break_policy="none")
        try:
            assert runner.mode == "cuda" and runner.fusions is not None
            outs = [run(model, kw) for kw in cases]
            again = [run(model, kw) for kw in cases]
            stats = runner.stats()
            verified = {k[0] for k, ok in runner.fusions.verifier.state.items() if ok}
        finally:
            runner.remove()
        assert all("forward" not in b.__dict__ for b in blocks)
    fx = stats["fusions"]
    print(f"\n[{type(model).__name__} fused] verified {sorted(verified)}; {fx}")
    for i, (ref, out, out2) in enumerate(zip(refs, outs, again)):
        assert torch.equal(out, ref), (i, (out.float() - ref.float()).abs().max().item())
        assert torch.equal(out2, ref), i
    assert fx["forwards_rejected"] == 0 and fx["fused_calls"] > 0 and fx["forwards_verified"] >= len(blocks)
    assert all(r.split()[0] in CANDIDATES for r in fx["rejections"]), fx["rejections"]
    assert stats["misses"] == 0 and stats["capture_failures"] == 0, stats
    return verified


REAL = {  # the released transformer configs, cut to 2 (+ 2) layers
    "flux": dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=[16, 56, 56]),
    "longcat_image": dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=128,
                          num_attention_heads=24, joint_attention_dim=3584, pooled_projection_dim=3584,
                          axes_dims_rope=[16, 56, 56]),
    "qwen_image": dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=128,
                       num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56)),
    "wan": dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=2, text_dim=4096,
                freq_dim=256, in_channels=16, out_channels=16, patch_size=(1, 2, 2), cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6),
}


def _flux_like(family, config, dtype):
    from tests import test_fusions_flux as T

    saved = T.TINY[family]
    T.TINY[family] = (saved[0], config)
    try:
        model = T.tiny_model(family, dtype).cuda()
        cases = [_cuda(T.tiny_inputs(family, dtype, batch=1, text=64, side=16)),
                 _cuda(T.tiny_inputs(family, dtype, batch=2, text=64, side=16, seed=1))]
    finally:
        T.TINY[family] = saved
    return model, cases, list(model.transformer_blocks) + list(model.single_transformer_blocks)


@pytest.mark.parametrize("family", ["flux", "longcat_image"])
@pytest.mark.parametrize("size", ["tiny", "real"])
def test_flux_like_fused_forward_equals_eager(family, size):
    from tests import test_fusions_flux as T

    config = T.TINY[family][1] if size == "tiny" else REAL[family]
    model, cases, blocks = _flux_like(family, config, torch.bfloat16)
    verified = _check_model(model, cases, blocks)
    assert {"ln_adaln", "gated_res_ln_adaln", "gated_residual"} <= verified
    assert verified & {"qk_pairs_fused", "qk_pairs_aten"}


@pytest.mark.parametrize("size", ["tiny", "real"])
def test_qwen_image_fused_forward_equals_eager(size):
    from jobs.models.qwen_image import capturable_text_lengths
    from tests import test_fusions_qwen_image as T

    capturable_text_lengths()  # what the family installs: the text length without a host sync
    saved = dict(T.TINY)
    T.TINY.clear()
    T.TINY.update(saved if size == "tiny" else REAL["qwen_image"])
    try:
        model = T.tiny_model(torch.bfloat16).cuda()
        cases = [_cuda(T.tiny_inputs(torch.bfloat16, batch=1, text=128, real=77, side=16)),
                 _cuda(T.tiny_inputs(torch.bfloat16, batch=2, text=128, real=20, side=16, seed=1))]
    finally:
        T.TINY.clear()
        T.TINY.update(saved)
    verified = _check_model(model, cases, list(model.transformer_blocks))
    assert {"ln_adaln", "gated_res_ln_adaln", "gated_residual"} <= verified
    assert verified & {"qk_complex_mean_fma_ac_ad", "qk_complex_aten_fma_ac_ad"}


@pytest.mark.parametrize("size", ["tiny", "real"])
def test_wan_fused_forward_equals_eager(size):
    from tests import test_fusions_wan as T

    saved = dict(T.TINY)
    T.TINY.clear()
    T.TINY.update(saved if size == "tiny" else REAL["wan"])
    try:
        model = T.tiny_model(torch.bfloat16).cuda()
        frames, side = (2, 4) if size == "tiny" else (3, 30)
        cases = []
        for seed, batch in ((0, 1), (1, 2)):
            kw = T.tiny_inputs(torch.bfloat16, batch=batch, text=512 if size == "real" else 6, seed=seed)
            kw["hidden_states"] = _rand(batch, 16, frames, side, side * 2 - 8 if size == "real" else side, g=_g(seed))
            cases.append(_cuda(kw))
    finally:
        T.TINY.clear()
        T.TINY.update(saved)
    verified = _check_model(model, cases, list(model.blocks))
    assert {"modulation_f32", "ln_adaln_f32", "res_ln_adaln_f32", "gated_residual_f32"} <= verified, verified
    assert verified & {"qk_wan_fused", "qk_wan_aten"}


@pytest.mark.parametrize("size", ["tiny", "real"])
def test_sana_video_fused_forward_equals_eager(size):
    from tests import test_fusions_sana_video as T

    saved = dict(T.TINY)
    if size == "real":  # SanaVideoTransformer3DModel's defaults (SANA-Video 2B), 2 layers
        T.TINY.clear()
        T.TINY.update(num_layers=2)
    try:
        model = T.tiny_model(torch.bfloat16).cuda()
        cfg = model.config
        T.TINY.setdefault("caption_channels", cfg.caption_channels)  # the real config's text width
        cases = []
        for seed, batch in ((0, 1), (1, 2)):
            kw = T.tiny_inputs(torch.bfloat16, batch=batch, text=8 if size == "tiny" else 128, seed=seed)
            frames, h, w = (2, 8, 8) if size == "tiny" else (3, 60, 104)
            kw["hidden_states"] = _rand(batch, cfg.in_channels, frames, h, w, g=_g(seed)).cpu()
            kw["encoder_hidden_states"] = _rand(batch, kw["encoder_hidden_states"].shape[1], cfg.caption_channels,
                                                g=_g(seed)).cpu()
            cases.append(_cuda(kw))
    finally:
        T.TINY.clear()
        T.TINY.update(saved)
    verified = _check_model(model, cases, list(model.transformer_blocks))
    assert {"modulation_video", "ln_adaln", "gated_residual", "res_ln_adaln"} <= verified, verified



# LTX-2.0 as released (the class defaults but its split RoPE; Lightricks/LTX-2's transformer config),
# cut to 2 layers; and LTX-2.3's switches (gated attention, text modulation, the perturbed processor)
# on the tiny geometry
LTX2_REAL = dict(num_layers=2, rope_type="split")


def _ltx2_run(model, kw):
    video, audio = model(**kw)
    return torch.cat([video.flatten(), audio.flatten()])


def _ltx2_coords(model, kw):
    """The call as LTX2Pipeline makes it: the positions made once before the loop, on the GPU. (Left to the
    forward, its `torch.tensor(patch_size, device=...)` copies from pageable host memory, which no CUDA graph
    can capture: the signature would run eager.)"""
    batch, device = kw["hidden_states"].shape[0], kw["hidden_states"].device
    return dict(kw, video_coords=model.rope.prepare_video_coords(batch, kw["num_frames"], kw["height"], kw["width"],
                                                                 device, fps=kw["fps"]),
                audio_coords=model.audio_rope.prepare_audio_coords(batch, kw["audio_num_frames"], device))


@pytest.mark.parametrize("size", ["tiny", "tiny_interleaved", "tiny_ltx23", "real"])
def test_ltx2_fused_forward_equals_eager(size):
    from tests import test_fusions_ltx2 as T

    config = {"tiny": T.TINY, "tiny_interleaved": dict(T.TINY, rope_type="interleaved"), "tiny_ltx23": T.LTX23,
              "real": LTX2_REAL}[size]
    model = T.tiny_model(torch.bfloat16, config).cuda()
    if size == "real":  # 3 latent frames of 480x832, 2 s of sound; the connectors' 1024 text tokens
        cases = [T.tiny_inputs(torch.bfloat16, model, batch=b, text=1024, seed=b, mask=b == 2, shape=(3, 15, 26, 51))
                 for b in (1, 2)]
    else:
        cases = [T.tiny_inputs(torch.bfloat16, model, batch=1, seed=0),
                 T.tiny_inputs(torch.bfloat16, model, batch=2, text=8, seed=1, mask=True)]
    cases = [_ltx2_coords(model, _cuda(kw)) for kw in cases]
    verified = _check_model(model, cases, list(model.transformer_blocks), run=_ltx2_run)
    assert {"modulation_video", "rms_norm_adaln", "gated_residual"} <= verified, verified
    assert verified & {op.name for op in ops_rms.RMS_VARIANCE}
    rope = ops_rope.QK_LTX if size == "tiny_interleaved" else ops_rope.QK_LTX_SPLIT
    assert verified & {op.name for op in rope}, verified
    if size == "tiny_ltx23":
        assert "adaln" in verified


# GLM-Image's DiT as released: GlmImageTransformer2DModel's defaults (2560 wide, 64 heads of 40, glyph
# embeddings 1472 wide), cut to 2 layers
GLM_IMAGE_REAL = dict(num_layers=2)


@pytest.mark.parametrize("size", ["tiny", "real"])
def test_glm_image_fused_forward_equals_eager(size):
    """With the family's graph-friendly calls, as the job loads the DiT (jobs/models/glm_image.py: the
    prior-drop index as `where`, the rotary table made once per grid on the device, passed in): the
    fused blocks and final norm equal eager under graph replay. Real: 1024x1024 at batch 1 with one
    glyph row (the job's unquoted prompt), 512x512 at batch 2 with 16 glyph rows, prior tokens dropped
    for the second sample (the unconditional branch)."""
    import types

    from jobs.models.glm_image import GlmImageFamily
    from tests import test_fusions_glm_image as T

    model = T.tiny_model(torch.bfloat16, None if size == "tiny" else GLM_IMAGE_REAL).cuda()
    GlmImageFamily().patch(types.SimpleNamespace(transformer=model))
    cfg = dict(model.config)
    if size == "tiny":
        cases = [T.tiny_inputs(torch.bfloat16, batch=1, text=5, side=8, config=cfg),
                 T.tiny_inputs(torch.bfloat16, batch=2, text=7, side=16, seed=1, mask=True, config=cfg)]
    else:
        cases = [T.tiny_inputs(torch.bfloat16, batch=1, text=1, side=128, config=cfg),
                 T.tiny_inputs(torch.bfloat16, batch=2, text=16, side=64, seed=1, config=cfg)]
    verified = _check_model(model, [_cuda(kw) for kw in cases], list(model.transformer_blocks) + [model.norm_out])
    assert {"ln_adaln", "gated_res_ln_adaln", "gated_residual", "qk_glm_split_plain"} <= verified, verified


def test_minimax_h3_chains_are_bit_exact_at_real_sizes():
    """MiniMax-H3 as released (5376 wide, 56 heads of 128, RoPE on each head's leading 96 channels): the q / k
    RMSNorm + partial rotate-half in fp32 (the split kernel once a half of the [S, 96] tables) and in fp32 and
    bf16 through the real-pair kernel (the rotary channels as adjacent pairs, the tables in x's dtype: eager's
    bf16 products), tables whose halves repeat (the model's) or differ, batch 1 and 2; and in bf16 the per-row
    adaLN and gated residual at batch 1 (one [S, D] row a token, as [S, 1, D] with a zero token stride),
    against eager's ops."""
    import itertools

    from bcg.fusions import minimax_h3

    fx = Verifier("triton", cache=None)
    g = _g(11)
    S, H, D, R, W = 4096, 56, 128, 96, 5376
    ang = torch.rand(S, R // 2, generator=g, device="cuda") * 100
    tables = [torch.cat([ang, ang], -1), torch.rand(S, R, generator=g, device="cuda") * 100]
    cases = [(torch.float32, ops_rope.QK_MINIMAX + ops_rope.QK_MINIMAX_PAIRS),
             (torch.bfloat16, ops_rope.QK_MINIMAX_PAIRS)]
    with torch.no_grad():
        for (dtype, chain_ops), B, table in itertools.product(cases, (1, 2), tables):
            norm = _norm(nn.RMSNorm, D, dtype, g, eps=1e-5)
            x = _rand(B, S, H, D, g=g, scale=3, dtype=dtype)
            freqs = (table.cos(), table.sin())
            for op in chain_ops:
                want = op.eager(x, norm, freqs)
                first, again = fx.call(op, x, norm, freqs), fx.call(op, x, norm, freqs)
                assert torch.equal(first, want) and torch.equal(again, want), (op.name, dtype, B)
                assert again.stride() == want.stride() and fx.state.get(fx.key(op, (x, norm, freqs))), op.name
        h, y, n = (_rand(1, S, W, g=g, scale=2) for _ in range(3))
        scale, shift, gate = (_rand(S, W, g=g, scale=0.5) for _ in range(3))
        for _ in range(2):
            assert torch.equal(minimax_h3.adaln_rows(fx.call, n, scale, shift), n * (1.0 + scale) + shift)
            assert torch.equal(minimax_h3.gated_residual_rows(fx.call, h, gate, y), h + gate * y)
    c = fx.counters
    print(f"\n[MiniMax-H3 chains] {c.as_dict()}")
    assert c.rejected == 0 and c.not_applicable == 0 and c.fused_calls > 0, c


# MiniMax-H3's DiT as released: MiniMaxH3Transformer3DModel's defaults (5376 wide, 56 heads of 128, text 5120
# wide, 2 refiner layers), cut to 2 layers
MINIMAX_H3_REAL = dict(num_layers=2)


def _minimax_run(model, kw):
    video, audio = model(**kw)
    return torch.cat([video.flatten(), audio.flatten()])


@pytest.mark.parametrize("size", ["tiny", "real"])
def test_minimax_h3_fused_forward_equals_eager(size):
    """As the job loads the DiT (bf16, `_keep_in_fp32_modules` kept fp32) and calls it (the t2va packed layout,
    the per-row timestep plan, on the device): the fused blocks and final norm equal eager under graph replay,
    at batch 1 (the per-row modulation kernels) and batch 2 (eager's modulation); the q / k rotation through
    the real-pair kernel (bf16; the fp32 tiny pipeline, test_fusions_z_image_gpu.py, runs the split one)."""
    from tests import test_fusions_minimax_h3 as T

    if size == "tiny":
        model = T.tiny_model(torch.bfloat16).cuda()
        cfg = dict(T.TINY)
        cases = [T.tiny_inputs(torch.bfloat16, config=cfg),
                 T.tiny_inputs(torch.bfloat16, batch=2, text=3, side=2, audio=2, seed=1, t=0.4, ta=0.3, config=cfg)]
    else:
        with torch.device("cuda"):
            model = T.tiny_model(torch.bfloat16, MINIMAX_H3_REAL)
        cfg = dict(model.config)
        cases = [T.tiny_inputs(torch.bfloat16, text=64, frames=4, side=32, audio=40, config=cfg),
                 T.tiny_inputs(torch.bfloat16, batch=2, text=16, frames=2, side=16, audio=20, seed=1, t=0.4,
                               ta=0.3, config=cfg)]
    verified = _check_model(model, [_cuda(kw) for kw in cases], list(model.transformer_blocks) + [model.norm_out],
                            run=_minimax_run)
    assert {"adaln", "gated_residual", "qk_minimax_pairs"} <= verified, verified
