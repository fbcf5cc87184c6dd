"""LayerNorm (no affine) + adaLN modulation in one Triton kernel, bit-exact with aten's CUDA
LayerNorm (imported only where Triton and CUDA exist).

aten's `vectorized_layer_norm_kernel` (layer_norm_kernel.cu; taken when the row length is a
multiple of 4 and the pointers are 8-byte aligned) reduces one row per block of 32 x 4 threads:
- thread t = lane + 32 * warp reads the 4-element vectors t, t + 128, ... and folds each element
  into its running Welford state in order (`cuWelfordOnlineSum`: mean += delta * (1 / count));
- the 32 lanes of a warp merge by shuffle-down (lane i takes lane i + 16, then + 8, ... + 1),
  then the 4 warps pairwise through shared memory (warp w takes warp w + 2, then + 1)
  (`cuWelfordCombine`);
- var = sigma2 / N, rstd = rsqrtf(var + eps), y = rstd * (x - mean), rounded to the storage dtype.
This kernel keeps that order: each of its 128 "threads" is one element of a 1-D tensor laid out
one per hardware thread, and Triton's tree reduction over it (butterfly shuffles 16 ... 1, then
the 4 warps' partials 2, 1) merges the same pairs in the same order as aten's (REDUCE=0 spells
the shuffle-down out instead: same bits, 20x slower). nvcc compiles aten with FMA contraction on
(its default), so the products that feed adds are explicit FMAs here. Where the contraction is
ambiguous (`nA * meanA + nB * meanB`) and for the other floating-point choices, the defaults are
the forms that matched aten's per-row mean and rstd on every fp32 and bf16 row tried on the H200
(benchmarks/bench_fusion_kernels.py --diagnose -> benchmarks/results/ln_diagnosis_h200.json).

The adaLN part then follows the elementwise rounding plan of kernels.py (fp32 ops, storage-dtype
rounding where eager stores): `ln(x) * (1 + scale) + shift`. With `HAS_RES`, the row is first
`a + h` (the cross-attention residual that SANA's `norm2` reads), or `h + gate * a` (the
feed-forward's residual that the next block's `norm1` reads), stored as the new hidden state and
normalised from its rounded values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .applicable import check as _check
from .kernels import OPTS, _r

_LANES, _WARPS, _VEC = 32, 4, 4  # aten: a warp, num_threads() = C10_WARP_SIZE * 4, vec_size
# The normalising pass's chunk: 8 elements a thread (one 16-byte bf16 vector). On the H200 (session 39)
# chunks of 512, 1,024 and 2,048 each gave eager's bytes (plain and residual forms, 3 of 3 seeds at four
# shapes). With 1,024, the statistics pass's vector loads and Welford's 1/count as constants, the
# gated form takes 81 us at 1024², batch 8, against the unchunked kernel's 122 (CUDA graphs, session 40:
# benchmarks/results/fusion_kernels_ln_h200.md, _before.json), 3.7 TB/s; the bytes are eager's.
CHUNK = 1024
LANES = tl.constexpr(_LANES)
WARPS = tl.constexpr(_WARPS)
VEC = tl.constexpr(_VEC)


@triton.jit
def _combine(mb, sb, cb, ma, sa, ca, MEAN_FMA: tl.constexpr, SIG_FMA: tl.constexpr = 0):
    """cuWelfordCombine(dataB, dataA) as nvcc compiles it."""
    delta = mb - ma
    count = ca + cb
    coef = tl.div_rn(tl.full(count.shape, 1.0, tl.float32), count)
    na = ca * coef
    nb = cb * coef
    if MEAN_FMA == 0:
        mean = tl.fma(na, ma, nb * mb)
    elif MEAN_FMA == 1:
        mean = tl.fma(nb, mb, na * ma)
    else:
        mean = na * ma + nb * mb
    if SIG_FMA == 0:
        sigma2 = tl.fma(delta * delta * ca, nb, sa + sb)
    else:
        sigma2 = (sa + sb) + delta * delta * ca * nb
    pos = count > 0.0
    return tl.where(pos, mean, 0.0), tl.where(pos, sigma2, 0.0), count


@triton.jit
def _combine_m0(mb, sb, cb, ma, sa, ca):  # tl.reduce's combine_fn(accumulated, incoming)
    return _combine(mb, sb, cb, ma, sa, ca, 0)


@triton.jit
def _combine_m1(mb, sb, cb, ma, sa, ca):
    return _combine(mb, sb, cb, ma, sa, ca, 1)


@triton.jit
def _combine_m2(mb, sb, cb, ma, sa, ca):
    return _combine(mb, sb, cb, ma, sa, ca, 2)


@triton.jit
def _halve(m, s, c, R: tl.constexpr, OFF: tl.constexpr, MEAN_FMA: tl.constexpr, SIG_FMA: tl.constexpr):
    """[R, 2 * OFF] -> [R, OFF]: element i merges element i + OFF (a shuffle-down step)."""
    m = tl.reshape(tl.permute(tl.reshape(m, (R, 2, OFF)), (0, 2, 1)), (R, OFF, 2))
    s = tl.reshape(tl.permute(tl.reshape(s, (R, 2, OFF)), (0, 2, 1)), (R, OFF, 2))
    c = tl.reshape(tl.permute(tl.reshape(c, (R, 2, OFF)), (0, 2, 1)), (R, OFF, 2))
    m_lo, m_hi = tl.split(m)
    s_lo, s_hi = tl.split(s)
    c_lo, c_hi = tl.split(c)
    return _combine(m_lo, s_lo, c_lo, m_hi, s_hi, c_hi, MEAN_FMA, SIG_FMA)


@triton.jit
def _load_row_x(x_ptr, h_ptr, g_ptr, base, g_base, g_sd, offs, mask, HAS_RES: tl.constexpr, F32: tl.constexpr = False):
    x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES == 1:  # the residual's sum, rounded where eager stores it
        h = tl.load(h_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        x = (x + h).to(x_ptr.dtype.element_ty).to(tl.float32)
    elif HAS_RES == 2:  # h + gate * x (the feed-forward's residual): the product stored, then the sum
        h = tl.load(h_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + g_base + offs * g_sd, mask=mask, other=0.0).to(tl.float32)
        if F32:  # Wan: (h.float() + x.float() * gate).type_as(h), the product kept in fp32
            x = (h + g * x).to(x_ptr.dtype.element_ty).to(tl.float32)
        else:
            x = (h + (g * x).to(x_ptr.dtype.element_ty).to(tl.float32)).to(x_ptr.dtype.element_ty).to(tl.float32)
    return x


@triton.jit
def _ln_adaln_kernel(x_ptr, h_ptr, s_ptr, t_ptr, o_ptr, r_ptr, m_ptr, rs_ptr, D, N, eps, s_sb, s_sd,
                     t_sb, t_sd, g_ptr, g_sb, g_sd, w_ptr, bb_ptr, HAS_RES: tl.constexpr, MEAN_FMA: tl.constexpr,
                     ROUNDS: tl.constexpr, CHUNK: tl.constexpr, NCHUNK: tl.constexpr, ONLINE: tl.constexpr = 0,
                     SIG_FMA: tl.constexpr = 0,
                     RSQ: tl.constexpr = 0, REDUCE: tl.constexpr = 1, STATS: tl.constexpr = False,
                     F32: tl.constexpr = False, MOD: tl.constexpr = True, AFFINE: tl.constexpr = False):
    # F32: Wan's FP32LayerNorm on x.float(), its modulation in fp32, one rounding at the end (and the
    # gated residual's product kept in fp32). MOD: the adaLN modulation follows. AFFINE: the norm's own
    # weight and bias, `gamma * (rstd * (x - mean)) + beta` as one FMA (as nvcc contracts it; unproven).
    # ONLINE / SIG_FMA / RSQ / MEAN_FMA / REDUCE: the alternatives benchmarks/bench_fusion_kernels.py
    # --diagnose compares with aten's per-row mean and rstd. On the H200 (fp32 and bf16 rows,
    # D = 32, 1152, 2240) only the defaults (MEAN_FMA 0) match every row, with either reduction;
    # the explicit tree (REDUCE=0) is 20x slower than Triton's (benchmarks/results/ln_diagnosis_h200.json).
    row = tl.program_id(0).to(tl.int64)
    base = row * D
    b = row // N
    g_base = b * g_sb
    t = tl.arange(0, LANES * WARPS)
    nvec = D // VEC
    mean = tl.zeros((LANES * WARPS,), tl.float32)
    m2 = tl.zeros((LANES * WARPS,), tl.float32)
    cnt = tl.zeros((LANES * WARPS,), tl.float32)
    tl.static_assert(VEC == 4, "the vector is split in two halves twice")
    for k in tl.static_range(ROUNDS):  # cuWelfordOnlineSum over this thread's vectors, in order
        v = t + k * (LANES * WARPS)
        vm = v < nvec
        # the thread's vector in one 8-byte load, then its elements in order: split leaves the values
        # as loaded (no arithmetic), so the sums see what one load an element saw, in the same order
        # (one load an element compiled to 2-byte loads: benchmarks/kernel_ptx.py)
        x4 = _load_row_x(x_ptr, h_ptr, g_ptr, base, g_base, g_sd,
                         v[:, None] * VEC + tl.arange(0, VEC)[None, :], vm[:, None], HAS_RES, F32)
        even, odd = tl.split(tl.reshape(x4, (LANES * WARPS, 2, 2)))  # elements 0, 2 and 1, 3
        e0, e2 = tl.split(even)
        e1, e3 = tl.split(odd)
        for ii in tl.static_range(VEC):
            x = e0 if ii == 0 else (e1 if ii == 1 else (e2 if ii == 2 else e3))
            new_cnt = cnt + 1.0
            delta = x - mean
            # 1 / new_cnt, a constant: every thread still active here has taken each step before
            # (its vectors t, t + 128, ... all lie below nvec), so its count is this step's number.
            # 1.0 / n in double rounds to the fp32 quotient for every n below 2**16 (checked with
            # numpy), so the constant is div_rn(1, n)'s bits. Threads past nvec discard the update.
            inv = tl.full(new_cnt.shape, 1.0 / (k * VEC + ii + 1), tl.float32)
            if ONLINE == 0 or ONLINE == 2:
                new_mean = tl.fma(delta, inv, mean)
            elif ONLINE == 3:
                new_mean = mean + tl.div_rn(delta, new_cnt)
            else:
                new_mean = mean + delta * inv
            if ONLINE == 0 or ONLINE == 3:
                new_m2 = tl.fma(delta, x - new_mean, m2)
            else:
                new_m2 = m2 + delta * (x - new_mean)
            mean = tl.where(vm, new_mean, mean)
            m2 = tl.where(vm, new_m2, m2)
            cnt = tl.where(vm, new_cnt, cnt)
    if REDUCE == 1:  # Triton's own reduction: butterfly shuffles 16..1, then the warps 2, 1
        if MEAN_FMA == 0:
            mu, sg, _ = tl.reduce((mean, m2, cnt), 0, _combine_m0)
        elif MEAN_FMA == 1:
            mu, sg, _ = tl.reduce((mean, m2, cnt), 0, _combine_m1)
        else:
            mu, sg, _ = tl.reduce((mean, m2, cnt), 0, _combine_m2)
    else:  # intra-warp shuffle-down, then the 4 warps pairwise, spelled out
        m = tl.reshape(mean, (WARPS, LANES))
        s = tl.reshape(m2, (WARPS, LANES))
        c = tl.reshape(cnt, (WARPS, LANES))
        m, s, c = _halve(m, s, c, WARPS, 16, MEAN_FMA, SIG_FMA)
        m, s, c = _halve(m, s, c, WARPS, 8, MEAN_FMA, SIG_FMA)
        m, s, c = _halve(m, s, c, WARPS, 4, MEAN_FMA, SIG_FMA)
        m, s, c = _halve(m, s, c, WARPS, 2, MEAN_FMA, SIG_FMA)
        m, s, c = _halve(m, s, c, WARPS, 1, MEAN_FMA, SIG_FMA)
        m = tl.reshape(m, (1, WARPS))
        s = tl.reshape(s, (1, WARPS))
        c = tl.reshape(c, (1, WARPS))
        m, s, c = _halve(m, s, c, 1, 2, MEAN_FMA, SIG_FMA)
        m, s, c = _halve(m, s, c, 1, 1, MEAN_FMA, SIG_FMA)
        mu = tl.sum(tl.reshape(m, (1,)), axis=0)  # one element: the sum is that element
        sg = tl.sum(tl.reshape(s, (1,)), axis=0)
    var = tl.div_rn(sg, D.to(tl.float32))
    if RSQ == 0:
        rstd = tl.rsqrt(var + eps)
    elif RSQ == 1:
        rstd = libdevice.rsqrt(var + eps)
    else:
        rstd = tl.div_rn(1.0, tl.sqrt_rn(var + eps))
    if STATS:
        tl.store(m_ptr + row, mu)
        tl.store(rs_ptr + row, rstd)
    # normalise, round (LayerNorm's store), then adaLN's plan: elementwise, so in chunks of CHUNK
    # (a whole padded row at once held 32 values a thread per tensor at D = 2240, and left lanes idle)
    for c in tl.static_range(NCHUNK):
        offs = c * CHUNK + tl.arange(0, CHUNK)
        dm = offs < D
        x = _load_row_x(x_ptr, h_ptr, g_ptr, base, g_base, g_sd, offs, dm, HAS_RES, F32)
        if HAS_RES:
            tl.store(r_ptr + base + offs, x.to(r_ptr.dtype.element_ty), mask=dm)
        y = rstd * (x - mu)
        if AFFINE:
            w = tl.load(w_ptr + offs, mask=dm, other=0.0).to(tl.float32)
            bb = tl.load(bb_ptr + offs, mask=dm, other=0.0).to(tl.float32)
            y = tl.fma(w, y, bb)
        if MOD:
            sc = tl.load(s_ptr + b * s_sb + offs * s_sd, mask=dm, other=0.0).to(tl.float32)
            sh = tl.load(t_ptr + b * t_sb + offs * t_sd, mask=dm, other=0.0).to(tl.float32)
            if F32:
                y = y * (sc + 1.0) + sh
            else:
                y = _r(_r(y, o_ptr) * _r(sc + 1.0, o_ptr), o_ptr) + sh
        tl.store(o_ptr + base + offs, y.to(o_ptr.dtype.element_ty), mask=dm)


def ln_adaln(x: torch.Tensor, eps: float, scale: torch.Tensor | None, shift: torch.Tensor | None,
             residual: torch.Tensor | None = None, mean_fma: int = 0, stats: tuple | None = None,
             gate: torch.Tensor | None = None, f32: bool = False, weight: torch.Tensor | None = None,
             bias: torch.Tensor | None = None, **forms):
    """adaLN(LayerNorm(x)) for contiguous x [B, N, D] (no affine); with `residual`, x is first
    `x + residual` (with `gate` [B or 1, 1, D] too: `residual + gate * x`, the feed-forward's gated
    residual) and the pair (that sum, adaLN(LN(that sum))) is returned.
    `f32`: Wan's plan (FP32LayerNorm, fp32 modulation, one rounding; scale / shift / gate may be fp32).
    `weight` and `bias` (both, [D]) with scale = shift = None: the norm's own affine, no modulation.
    `stats` (mean, rstd fp32 [B * N]) and `forms` (ONLINE, SIG_FMA, RSQ, REDUCE) are for the
    diagnosis in benchmarks/bench_fusion_kernels.py."""
    _check(x.dim() == 3 and x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16, torch.float32),
           "x must be a contiguous [B, N, D] of a float dtype")
    mod = scale is not None
    _check(mod == (shift is not None) and (weight is None) == (bias is None) and (mod or weight is not None),
           "scale with shift, or the norm's weight with its bias")
    mdt = (torch.float32, x.dtype) if f32 else (x.dtype,)
    if mod:
        assert scale is not None and shift is not None  # mod, and the check above: shift comes with scale
        _check(scale.dtype in mdt and shift.dtype in mdt, "scale / shift must have x's dtype (or fp32: f32)")
    B, N, D = x.shape
    align = x.element_size() * _VEC
    _check(D % _VEC == 0 and D < (1 << 24), "aten's vectorized LayerNorm path needs D % 4 == 0")
    if weight is not None:
        assert bias is not None  # the check above: bias comes with weight
        _check(weight.shape == bias.shape == (D,) and weight.is_contiguous() and bias.is_contiguous(),
               "weight and bias must be contiguous [D]")
    if residual is not None:
        _check(residual.shape == x.shape and residual.is_contiguous() and residual.dtype == x.dtype,
               "residual must be a contiguous tensor like x")
    _check(gate is None or residual is not None, "a gate needs a residual")
    g = gate.expand(B, N, D) if gate is not None else None
    _check(g is None or (g.dtype in mdt and (N == 1 or g.stride(1) == 0)),
           "gate must have x's dtype (or fp32: f32) and broadcast over tokens")
    # scale and shift are both set exactly when mod (the check above)
    s, t = (scale.expand(B, N, D), shift.expand(B, N, D)) if scale is not None and shift is not None else (x, x)
    _check(not mod or N == 1 or (s.stride(1) == 0 and t.stride(1) == 0), "scale/shift must broadcast over tokens")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else out
    # aten takes the vectorized kernel only on aligned buffers; its input is the residual's fresh
    # (aligned) output when HAS_RES, and x.float()'s fresh copy with f32 (Wan)
    _check(out.data_ptr() % align == 0 and (residual is not None or f32 or x.data_ptr() % align == 0),
           "unaligned buffers take aten's other LayerNorm kernel")
    rounds = triton.cdiv(D // _VEC, _LANES * _WARPS)
    chunk = min(CHUNK, triton.next_power_of_2(D))
    m, rs = stats if stats is not None else (out, out)
    has_res = 0 if residual is None else (1 if gate is None else 2)
    _ln_adaln_kernel[(B * N,)](x, residual if residual is not None else x, s, t, out, res, m, rs, D, N, eps,
                               s.stride(0) if mod else 0, s.stride(2) if mod else 0,
                               t.stride(0) if mod else 0, t.stride(2) if mod else 0,
                               g if g is not None else x, g.stride(0) if g is not None else 0,
                               g.stride(2) if g is not None else 0,
                               weight if weight is not None else x, bias if bias is not None else x,
                               HAS_RES=has_res, MEAN_FMA=mean_fma, ROUNDS=rounds,
                               CHUNK=chunk, NCHUNK=triton.cdiv(D, chunk), STATS=stats is not None, F32=f32, MOD=mod,
                               AFFINE=weight is not None, num_warps=_WARPS, **forms, **OPTS)
    return (res, out) if residual is not None else out
