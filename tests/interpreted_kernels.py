"""Run by tests/test_fusions_interpreted.py in a subprocess with TRITON_INTERPRET=1 (Triton reads it
when the kernels are defined): every fused kernel on the CPU, in fp32 and fp16, against its plan in
plain torch. Prints one JSON line {check: null | what differed}.

Triton's interpreter runs the kernels in numpy: fp32 arithmetic and FMAs are exact, fp16 casts round
to nearest even (bf16 casts truncate: not used here). libdevice has no interpreter path, so its
functions are swapped for numpy's (tanh, exp) or Triton's (rsqrt: 1 / sqrt) and each plan uses the
same function: what this proves is the kernels' indexing, masks, rounding points and reduction
orders; that the modelled orders and libdevice functions are aten's is the GPU tests' job.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch

from tests.interpreter_libdevice import swap

swap()

from bcg.fusions import kernels, kernels_act, kernels_channel, kernels_norm, kernels_rms, kernels_rope, ops  # noqa: E402
from bcg.fusions.applicable import NotApplicable  # noqa: E402

kernels_rms.RSTD_IN_KERNEL = False  # the kernels read aten's rsqrt(var + eps) unless they reduce themselves
kernels_rope.EXPLICIT_TREE = True  # the fused RMSNorm's cross-thread tree spelled out (module docstring)

RESULTS: dict[str, str | None] = {}
G = torch.Generator().manual_seed(0)


def rand(*shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=G) * scale).to(dtype)


def check(name: str, got, want) -> None:
    if isinstance(want, tuple):
        for i, (g, w) in enumerate(zip(got, want)):
            check(f"{name}[{i}]", g, w)
        return
    ok = torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
    RESULTS[name] = None if ok else (f"{int((got != want).sum())} of {want.numel()} differ, max "
                                     f"{float((got.float() - want.float()).abs().max()):.3g}, strides "
                                     f"{got.stride()} vs {want.stride()}, {got.dtype} vs {want.dtype}")


def np_tanh(t):
    return torch.from_numpy(np.tanh(t.numpy()))


def np_silu(t):
    return t / (1 + torch.from_numpy(np.exp(-t.numpy())))


def rsqrt(t):
    """What the interpreter runs for tl.rsqrt: numpy's fp32 1 / sqrt (torch's `1 / t` is a reciprocal
    kernel that can differ by an ulp)."""
    return torch.from_numpy(1 / np.sqrt(t.numpy()))


# -- elementwise --------------------------------------------------------------------------------
def elementwise(dt):
    B, N, D = 2, 5, 24
    x, s, t = rand(B, N, D, dtype=dt), rand(B, 1, D, scale=0.3, dtype=dt), rand(B, 1, D, dtype=dt)
    check(f"adaln {dt}", kernels.adaln(x, s, t), ops.ADALN.reference(x, s, t))
    y = rand(B, N, D, dtype=dt)
    check(f"gated_residual {dt}", kernels.gated_residual(x, s, y), ops.GATED_RESIDUAL.reference(x, s, y))
    g32 = rand(B, 1, D, scale=0.3)  # Wan: an fp32 gate, the product kept in fp32
    check(f"gated_residual f32 {dt}", kernels.gated_residual(x, g32, y, f32=True),
          (x.float() + y.float() * g32).to(dt))
    a, b = rand(B, N, D, scale=3, dtype=dt), rand(B, N, D, dtype=dt)
    check(f"swiglu {dt}", kernels_act.swiglu(a, b), (np_silu(a.float()).to(dt).float() * b.float()).to(dt))
    for fma in (True, False):
        xf = a.float()
        cube = (xf * xf) * xf
        k = np.float32(kernels_act.K_KAPPA)
        inner = ((xf.double() + k * cube.double()).float() if fma else xf + k * cube) * np.float32(kernels_act.K_BETA)
        want = torch.cat([x, ((0.5 * xf) * (1 + np_tanh(inner))).to(dt)], dim=-1)
        check(f"gelu_cat fma={fma} {dt}", kernels_act.gelu_cat(x, a, gelu_fma=fma), want)
    strided = torch.cat([x, x], dim=2)[:, :, :D]  # the attention output as a strided view
    check(f"gelu_cat strided first {dt}", kernels_act.gelu_cat(strided, a)[..., :D].contiguous(), x)


# -- LayerNorm + adaLN after the statistics (the Welford order itself is proven on the H200) ------------
def layer_norm(dt):
    B, N, D = 2, 3, 64
    x = rand(B, N, D, scale=2, dtype=dt)
    mean, rstd = torch.empty(B * N), torch.empty(B * N)
    s, t = rand(B, 1, D, scale=0.3, dtype=dt), rand(B, 1, D, dtype=dt)
    got = kernels_norm.ln_adaln(x, 1e-6, s, t, stats=(mean, rstd))
    n = (rstd.view(B, N, 1) * (x.float() - mean.view(B, N, 1))).to(dt)
    check(f"ln_adaln after stats {dt}", got, ops.ADALN.reference(n, s, t))
    s32, t32 = s.float(), t.float()  # Wan: FP32LayerNorm, fp32 modulation, one rounding
    got = kernels_norm.ln_adaln(x, 1e-6, s32, t32, f32=True, stats=(mean, rstd))
    n32 = rstd.view(B, N, 1) * (x.float() - mean.view(B, N, 1))
    check(f"ln_adaln f32 after stats {dt}", got, (n32 * (1 + s32) + t32).to(dt))
    w, bb = rand(D, dtype=dt), rand(D, dtype=dt)
    got = kernels_norm.ln_adaln(x, 1e-6, None, None, f32=True, weight=w, bias=bb, stats=(mean, rstd))
    fma = (w.double() * n32.double() + bb.double()).float()  # one rounding, as an FMA
    check(f"ln affine f32 after stats {dt}", got, fma.to(dt))
    h = rand(B, N, D, dtype=dt)
    g32 = rand(B, 1, D, scale=0.3)
    r, got = kernels_norm.ln_adaln(x, 1e-6, s32, t32, residual=h, gate=g32, f32=True, stats=(mean, rstd))
    check(f"gated residual f32 into ln {dt}", r, (h.float() + g32 * x.float()).to(dt))
    n32 = rstd.view(B, N, 1) * (r.float() - mean.view(B, N, 1))
    check(f"gated residual f32 into ln_adaln {dt}", got, (n32 * (1 + s32) + t32).to(dt))


def unaligned():
    """A view 2 bytes off an aligned buffer: the LN kernel does not apply (aten takes another
    kernel there), and through the verifier it falls back to eager instead of raising."""
    from bcg.fusions import ops_norm
    from bcg.fusions.verify import Verifier

    buf = rand(2 * 3 * 64 + 1, dtype=torch.float16)
    x = buf[1:].view(2, 3, 64)
    norm = torch.nn.LayerNorm(64, elementwise_affine=False, eps=1e-6)
    s, t = rand(2, 1, 64, scale=0.3, dtype=torch.float16), rand(2, 1, 64, dtype=torch.float16)
    try:
        kernels_norm.ln_adaln(x, 1e-6, s, t)
        RESULTS["unaligned view is not applicable"] = "the kernel ran on a 2-byte-offset view"
    except NotApplicable:
        RESULTS["unaligned view is not applicable"] = None
    fx = Verifier("triton", cache=None)
    aligned = buf[:-1].view(2, 3, 64)
    fx.call(ops_norm.LN_ADALN, aligned, norm, s, t)
    out = fx.call(ops_norm.LN_ADALN, x, norm, s, t)
    c = fx.counters
    RESULTS["unaligned view falls back through the verifier"] = (
        None if torch.equal(out, ops_norm.LN_ADALN.eager(x, norm, s, t)) and c.not_applicable == 1
        else f"counters {c}")


# -- RMSNorm statistics in the modelled aten orders ---------------------------------------------------
def mean_order(x2d: torch.Tensor) -> torch.Tensor:
    """aten's mean of x^2 over rows of L (vec_dec), sum before `* factor`: lane l's 4 accumulators sum
    x^2[(j*32 + l)*4 + i] over j in order, then ((a0+a1)+a2)+a3, then a shuffle-down tree."""
    M, L = x2d.shape
    sq = (x2d.float() * x2d.float()).view(M, L // 128, 32, 4)
    acc = sq[:, 0]
    for j in range(1, L // 128):
        acc = acc + sq[:, j]
    t = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
    while t.shape[1] > 1:
        t = t[:, : t.shape[1] // 2] + t[:, t.shape[1] // 2:]
    return t[:, 0]


def fused_rms_order(x2d: torch.Tensor) -> torch.Tensor:
    """aten's fused RMSNorm sum of squares (modelled): thread t sums its vectors t, t + 128, ... in
    order, a shuffle-down tree over each warp's 32 lanes, then warps w + 2, then w + 1."""
    M, L = x2d.shape
    nvec = L // 4
    s = torch.zeros(M, 128)
    for k in range(math.ceil(nvec / 128)):
        for ii in range(4):
            v = torch.arange(128) + k * 128
            idx = (v * 4 + ii).clamp(max=L - 1)
            val = torch.where(v < nvec, x2d.float()[:, idx], torch.zeros(()))
            s = s + val * val  # exact squares (fp16 inputs): the FMA's single rounding is the add's
    w = s.view(M, 4, 32)
    while w.shape[2] > 1:
        w = w[..., : w.shape[2] // 2] + w[..., w.shape[2] // 2:]
    w = w[..., 0]
    return (w[:, 0] + w[:, 2]) + (w[:, 1] + w[:, 3])


def rms(dt):
    M, L = 40, 256
    x = rand(M, L, scale=2, dtype=dt)
    factor = np.float32(M) / np.float32(M * L)
    check(f"row_variance vec_dec {dt}", kernels_rms.row_variance(x, "vec_dec")[:, 0],
          mean_order(x) * torch.tensor(float(factor)))
    # after the variance: the norm (with or without its weight) and its modulation (LTX-2's adaLN, Z-Image's scale)
    B, N, D = 2, 5, 48
    x = rand(B, N, D, scale=2, dtype=dt)
    r = kernels_rms.rstd_input(x.float().pow(2).mean(-1, keepdim=True), 1e-6)  # aten's rsqrt (RSTD_IN_KERNEL off)
    s, t = rand(B, 1, D, scale=0.3, dtype=dt), rand(1, 1, D, dtype=dt)
    w = (1 + 0.3 * rand(D)).to(dt)
    n = (x.float() * r).to(dt)
    nw = (n.float() * w.float()).to(dt)
    check(f"rms_norm_adaln no weight {dt}", kernels_rms.rms_adaln(x, r, None, 1e-6, s, t), ops.ADALN.reference(n, s, t))
    check(f"rms_norm_adaln weight {dt}", kernels_rms.rms_adaln(x, r, w, 1e-6, s, t), ops.ADALN.reference(nw, s, t))
    check(f"rms_norm_adaln no modulation {dt}", kernels_rms.rms_adaln(x, r, None, 1e-6, None, None), n)
    check(f"rms_norm_scale {dt}", kernels_rms.rms_scale(x, r, w, 1e-6, s), (nw.float() * s.float()).to(dt))


# -- RoPE, with and without the norm, into a joint slice ------------------------------------------------
def pairs_plan(n, cos, sin, index):
    from bcg.fusions.ops_rope import _pairs_plan

    return _pairs_plan(n, cos, sin, index)


def rope(dt):
    KR = kernels_rope
    B, H, D = 2, 3, 128
    xt, xi = rand(B, 5, H, D, dtype=dt), rand(B, 11, H, D, dtype=dt)
    ang = torch.rand(16, D // 2, generator=G) * 30
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    out = torch.empty(B, 16, H, D, dtype=dt)
    KR.rope(xt, (cos[None, :5], sin[None, :5]), KR.Rope("pairs"), out, 0)
    KR.rope(xi, (cos[None, 5:], sin[None, 5:]), KR.Rope("pairs"), out, 5)
    check(f"rope pairs joint {dt}", out, pairs_plan(torch.cat([xt, xi], 1), cos, sin, KR.FLUX_INDEX))
    check(f"rope pairs wan index {dt}", KR.rope(xi, (cos[None, 5:], sin[None, 5:]), KR.Rope("pairs", index=KR.WAN_INDEX)),
          pairs_plan(xi, cos[5:], sin[5:], KR.WAN_INDEX))
    lc, ls = cos[5:].to(dt), sin[5:].to(dt)  # rope buffers cast with the model (Wan after .to(bf16))
    check(f"rope pairs storage-dtype freqs {dt}", KR.rope(xi, (lc[None], ls[None]), KR.Rope("pairs", index=KR.WAN_INDEX)),
          pairs_plan(xi, lc, ls, KR.WAN_INDEX))
    freqs = torch.polar(torch.ones(1, 11, D // 2), torch.rand(1, 11, D // 2, generator=G) * 30)
    a, b = xi.float()[..., 0::2], xi.float()[..., 1::2]
    fr = torch.view_as_real(freqs)[:, :, None]
    want = torch.stack([a * fr[..., 0] - b * fr[..., 1], a * fr[..., 1] + b * fr[..., 0]], -1).flatten(3).to(dt)
    check(f"rope complex plain {dt}", KR.rope(xi, freqs, KR.Rope("complex", "plain")), want)
    w = (1 + 0.3 * rand(D)).to(dt)
    # diffusers RMSNorm per head, the variance given (aten's CPU mean: the plan's), rstd read (aten's)
    var = xi.float().pow(2).mean(-1, keepdim=True)
    r = kernels_rms.rstd_input(var, 1e-6)
    n = ((xi.float() * r).to(dt).float() * w.float()).to(dt)
    check(f"rope after mean-order norm (given) {dt}",
          KR.rope(xi, (cos[None, 5:], sin[None, 5:]), KR.Rope("pairs"), norm="mean", weight=w, eps=1e-6, var=r),
          pairs_plan(n, cos[5:], sin[5:], KR.FLUX_INDEX))
    # the variance in the kernel: aten's GPU mean order (modelled), 1 / sqrt for rsqrt
    M = B * 11 * H
    v = mean_order(xi.reshape(M, D)) * torch.tensor(float(np.float32(M) / np.float32(M * D)))
    r = rsqrt(v + 1e-6).view(B, 11, H, 1)
    n = ((xi.float() * r).to(dt).float() * w.float()).to(dt)
    check(f"rope after mean-order norm (in kernel) {dt}",
          KR.rope(xi, (cos[None, 5:], sin[None, 5:]), KR.Rope("pairs"), norm="mean", weight=w, eps=1e-6),
          pairs_plan(n, cos[5:], sin[5:], KR.FLUX_INDEX))
    if dt == torch.float16:  # exact squares: the fused order's FMAs are its adds (fused_rms_order)
        for across, L in ((False, D), (True, H * D)):
            x2 = xi.reshape(-1, L)
            wl = (1 + 0.3 * rand(L)).to(dt)
            r = rsqrt(fused_rms_order(x2) / L + 1e-6)
            n = (wl.float() * (r[:, None] * x2.float())).to(dt).view(xi.shape)
            got = KR.rope(xi, (cos[None, 5:], sin[None, 5:]), KR.Rope("pairs", index=KR.WAN_INDEX), norm="fused",
                          weight=wl, eps=1e-6, across_heads=across)
            check(f"rope after fused-order norm across={across} {dt}", got,
                  pairs_plan(n, cos[5:], sin[5:], KR.WAN_INDEX))


def head_rows(dt):
    """_head_rows_kernel (rows of 128, several a program, pairs read and written as tiles) against the
    general kernels it stands in for, every norm and style, with a partial last program (66 rows)."""
    KR = kernels_rope
    B, S, H, D = 2, 11, 3, 128
    x = rand(B, S, H, D, scale=2, dtype=dt)
    w = (1 + 0.3 * rand(D)).to(dt)
    ang = torch.rand(S, D // 2, generator=G) * 30
    cs = (ang.cos().repeat_interleave(2, -1)[None], ang.sin().repeat_interleave(2, -1)[None])
    freqs = torch.polar(torch.ones(1, S, D // 2), ang[None])
    var = kernels_rms.rstd_input(x.float().pow(2).mean(-1, keepdim=True), 1e-6)
    cases = {"none pairs": dict(freqs=cs, rope_=KR.Rope("pairs")),
             "none complex": dict(freqs=freqs, rope_=KR.Rope("complex", "fma_ac_ad")),
             "mean given": dict(freqs=cs, rope_=KR.Rope("pairs"), norm="mean", weight=w, eps=1e-6, var=var),
             "mean in kernel complex": dict(freqs=freqs, rope_=KR.Rope("complex"), norm="mean", weight=w, eps=1e-6),
             "mean in kernel no weight": dict(freqs=cs, rope_=KR.Rope("pairs", index=KR.WAN_INDEX), norm="mean",
                                              eps=1e-6),
             "fused": dict(freqs=cs, rope_=KR.Rope("pairs", index=KR.WAN_INDEX), norm="fused", weight=w, eps=1e-6),
             "fused no weight": dict(freqs=cs, rope_=KR.Rope("pairs"), norm="fused", eps=1e-6)}
    for name, kw in cases.items():
        out = {}
        for head in (True, False):
            KR.HEAD_KERNEL = head
            joint = torch.full((B, S + 4, H, D), 7.0, dtype=dt)  # written at token 4 on: the rest untouched
            KR.rope(x, out=joint, t0=4, **kw)
            out[head] = joint
        KR.HEAD_KERNEL = True
        check(f"rope head rows {name} {dt}", out[True], out[False])


def rope_ltx(dt):
    """LTX-2's layouts: a set of frequencies a head (split, rotate-half pairs; as LTX-2's rope module lays
    them out and as a strided view), and interleaved pairs over the whole width with a batch of freqs."""
    from bcg.fusions.ops_rope import _split_plan

    KR = kernels_rope
    B, S, H, D = 2, 7, 4, 16
    x = rand(B, S, H, D, dtype=dt)
    ang = torch.rand(B, S, H, D // 2, generator=G) * 30
    laid = (ang.cos(), ang.sin())  # [B, S, H, D/2] contiguous: LTX-2's rope after its swapaxes is undone
    strided = tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in laid)  # same values, [B, H, S, D/2] memory
    for mode in ("plain", "fma_bd_ad"):
        for name, (c, sn) in (("laid out", laid), ("strided", strided)):
            check(f"rope split {mode} {name} {dt}", KR.rope(x, (c, sn), KR.Rope("split", mode)),
                  _split_plan(x, c, sn, mode))
    c, sn = laid
    w = (1 + 0.3 * rand(D)).to(dt)
    var = x.float().pow(2).mean(-1, keepdim=True)  # diffusers RMSNorm per head, the variance given
    r = kernels_rms.rstd_input(var, 1e-6)
    n = ((x.float() * r).to(dt).float() * w.float()).to(dt)
    check(f"rope after mean-order norm split per head (given) {dt}",
          KR.rope(x, (c, sn), KR.Rope("split", "plain"), norm="mean", weight=w, eps=1e-6, var=r),
          _split_plan(n, c, sn, "plain"))
    if dt == torch.float16:  # exact squares: the fused order's FMAs are its adds (fused_rms_order)
        x2 = x.reshape(-1, H * D)
        wl = (1 + 0.3 * rand(H * D)).to(dt)
        rr = rsqrt(fused_rms_order(x2) / (H * D) + 1e-6)
        n = (wl.float() * (rr[:, None] * x2.float())).to(dt).view(x.shape)
        check(f"rope after fused-order norm split across heads {dt}",
              KR.rope(x, (c, sn), KR.Rope("split", "plain"), norm="fused", weight=wl, eps=1e-6, across_heads=True),
              _split_plan(n, c, sn, "plain"))
    aw = torch.rand(B, S, H * D // 2, generator=G) * 30
    cw, sw = aw.cos().repeat_interleave(2, -1), aw.sin().repeat_interleave(2, -1)
    xw = x.reshape(B, S, 1, H * D)
    check(f"rope pairs batch freqs whole row {dt}", KR.rope(xw, (cw, sw), KR.Rope("pairs")),
          pairs_plan(xw, cw, sw, KR.FLUX_INDEX))


def rope_glm(dt):
    """GLM-Image's q / k chain as its fused plan runs it: aten's LayerNorm per head over [text, image],
    the image rows rotated (rotate-half, the split kernel once a half of the [S, D] tables) into their
    slice; batch 2 (a copy of the rows) and batch 1 (in place), tables whose halves repeat (the model's)
    or not; equal to the plan and, in fp32, to eager."""
    from bcg.fusions.ops_rope import QK_GLM

    op = QK_GLM[0]
    T, S, H, D = 3, 6, 2, 16
    norm = torch.nn.LayerNorm(D, elementwise_affine=False, eps=1e-5)
    ang = torch.rand(S, D // 4, generator=G) * 30
    ang = torch.cat([ang, ang], -1)
    tables = {"repeated": torch.cat([ang, ang], -1), "distinct": torch.rand(S, D, generator=G) * 30}
    for B in (2, 1):
        for name, a in tables.items():
            x = rand(B, T + S, H, D, dtype=dt)
            freqs = (a.cos(), a.sin())
            got = op.fused(x, norm, T, freqs)
            check(f"rope split glm {name} B={B} {dt}", got, op.reference(x, norm, T, freqs))
            if dt == torch.float32:
                check(f"rope split glm {name} eager B={B} {dt}", got, op.eager(x, norm, T, freqs))


def rope_minimax(dt):
    """MiniMax-H3's q / k chain as its fused plans run it: aten's RMSNorm per head (with a weight), the
    leading R channels of each head rotated (rotate-half), the rest passed through; R < D and R = D, tables
    whose halves repeat (the model's) or not. The split kernel once a half of the [S, R] tables (fp32 only:
    its tables are fp32) and the real-pair kernel on the rotary channels laid out as adjacent pairs (the
    tables cast to x's dtype, as eager casts them); equal to the plans and to eager."""
    from bcg.fusions.ops_rope import QK_MINIMAX, QK_MINIMAX_PAIRS

    g = torch.Generator().manual_seed(24)  # its own: the checks after it keep their inputs
    S, H, D = 6, 2, 24
    norm = torch.nn.RMSNorm(D, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.25 * torch.randn(D, generator=g))
    norm = norm.to(dt)
    ops = [("rope split minimax", QK_MINIMAX[0])] if dt == torch.float32 else []
    ops.append(("rope pairs minimax", QK_MINIMAX_PAIRS[0]))
    for R in (16, 24):
        ang = torch.rand(S, R // 2, generator=g) * 30
        tables = {"repeated": torch.cat([ang, ang], -1), "distinct": torch.rand(S, R, generator=g) * 30}
        for B in (2, 1):
            for name, a in tables.items():
                x = (torch.randn(B, S, H, D, generator=g) * 3).to(dt)
                freqs = (a.cos(), a.sin())
                for label, op in ops:
                    with torch.no_grad():
                        got = op.fused(x, norm, freqs)
                        check(f"{label} {name} R={R} B={B} {dt}", got, op.reference(x, norm, freqs))
                        check(f"{label} {name} eager R={R} B={B} {dt}", got, op.eager(x, norm, freqs))


# -- DC-AE's per-channel chains, on both dense image layouts ------------------------------------------
def channel(dt):
    B, C, H, W = 2, 8, 3, 5
    for layout in ("nchw", "channels_last"):
        fmt = torch.contiguous_format if layout == "nchw" else torch.channels_last

        def img(*shape, scale=1.0):
            return rand(*shape, scale=scale, dtype=dt).contiguous(memory_format=fmt)

        y, b = img(B, C, H, W, scale=2), rand(C, dtype=dt)
        want = np_silu((y.float() + b.float().view(1, -1, 1, 1)).to(dt).float()).to(dt)
        check(f"channel bias_silu {layout} {dt}", kernels.bias_silu_(y.clone(), b), want)
        d = img(B, 2 * C, H, W, scale=2)
        b2 = rand(2 * C, dtype=dt)
        for bias in (None, b2):
            got = kernels.bias_glu(d, bias)
            d32 = d.float() if bias is None else (d.float() + bias.float().view(1, -1, 1, 1)).to(dt).float()
            v, g = d32.chunk(2, dim=1)
            check(f"channel bias_glu {'bias' if bias is not None else 'no bias'} {layout} {dt}", got,
                  (v * np_silu(g).to(dt).float()).to(dt).contiguous(memory_format=fmt))
        h, x = img(B, C, H, W, scale=2), img(B, C, H, W)
        view = h.movedim(1, -1)
        check(f"channel squares {layout} {dt}", kernels_rms.rms_sq(view), view.float().pow(2))
        var = view.float().pow(2).mean(-1, keepdim=True)
        w, bb = rand(C, dtype=dt), rand(C, dtype=dt)
        n = (view.float() * rsqrt(var + 1e-5)).to(dt).float()
        n = ((n * w.float()).to(dt).float() + bb.float()).to(dt).movedim(-1, 1)
        check(f"channel rms {layout} {dt}", kernels_channel.channel_rms(h, var, w, bb, 1e-5), n)
        check(f"channel rms residual {layout} {dt}", kernels_channel.channel_rms(h, var, w, bb, 1e-5, x),
              (n.float() + x.float()).to(dt))
        check(f"channel rms relu {layout} {dt}", kernels_channel.channel_rms(h, var, w, bb, 1e-5, relu=True),
              torch.relu(n))
        for repeats, cin in ((2, 2 * C), (4, C)):  # DCUpBlock2d's repeats = 4 C_out / C_in
            src, c = img(B, cin, H, W), img(B, C, 2 * H, 2 * W, scale=2)
            shortcut = torch.nn.functional.pixel_shuffle(src.repeat_interleave(repeats, dim=1), 2)
            want = ((c.float() + b.float().view(1, -1, 1, 1)).to(dt).float() + shortcut.float()).to(dt)
            got = kernels_channel.up_shortcut_add_(c.clone(), b, src, repeats)
            check(f"channel up_shortcut R={repeats} {layout} {dt}", got.contiguous(memory_format=fmt), want.contiguous(memory_format=fmt))
        # C over the channels-last kernel's channel tile (128): two tiles. The NCHW kernel has no channel tile
        # (a program an output row): 200 planes there would be 1,600 programs of the path (B, C, H, W) runs.
        wide = [(B, 200, 2, 3)] if layout == "channels_last" else []
        for shape in ((B, C, H, W), (1, 3, 1, 2), *wide):
            src = img(*shape)
            want = torch.nn.functional.interpolate(src, scale_factor=2, mode="nearest")
            check(f"channel nearest2x {shape} {layout} {dt}", kernels_channel.nearest2x(src), want)


# -- SANA's linear attention in two kernels (kernels_linear.py) -------------------------------------
def linear(dt):
    """Small integers: every product and partial sum is exact in fp32, so any summation order gives
    eager's sums, and the check is of the layouts, relu, the ones row, the masking of the token tail
    and the division (the interpreter's tl.dot is NumPy's, not the GPU's FMA chain; the order is the
    H200 test's, tests/gpu/test_fusions_gpu.py)."""
    from bcg.fusions import kernels_linear
    from bcg.fusions.ops import _EPS, _lin_eager

    for B, N, heads, C in ((2, 70, 3, 32), (1, 33, 2, 16), (3, 64, 1, 32)):
        q, k, v = (torch.randint(-3, 4, (B, N, heads * C), generator=G).to(dt) for _ in range(3))
        k[0, : N // 2] = -1  # a head whose first tokens relu to zero
        want = _lin_eager(q, k, v, heads)
        check(f"linear_fma B={B} N={N} C={C} {dt}", kernels_linear.linear_attention_fma(q, k, v, heads, _EPS), want)
        # other tilings: the bits do not depend on them (token blocks past N masked)
        for t in (kernels_linear.TILING._replace(bk=16, scores_warps=2, out_warps=4),
                  kernels_linear.TILING._replace(bk=16, bn=16)):
            got = kernels_linear.linear_attention_fma(q, k, v, heads, _EPS, t)
            check(f"linear_fma B={B} N={N} C={C} {dt} {t}", got, want)


for dt in (torch.float32, torch.float16):
    linear(dt)
    channel(dt)
    head_rows(dt)
    elementwise(dt)
    layer_norm(dt)
    rms(dt)
    rope(dt)
    rope_ltx(dt)
    rope_glm(dt)
    rope_minimax(dt)
unaligned()
print("RESULTS " + json.dumps(RESULTS))
sys.stdout.flush()
