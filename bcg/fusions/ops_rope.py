"""q/k chains of the families: each one's norm + RoPE (+ joint attention's concatenation) as eager
runs it, its plan in plain torch, and the shared kernel (kernels_rope.rope).

    chain                 eager (diffusers 0.42)                               families
    qk_pairs_*            torch.nn.RMSNorm per head, cat [text, image],        Flux, LongCat
                          apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    qk_complex_*          diffusers RMSNorm per head, apply_rotary_emb_qwen    Qwen-Image
                          (complex) per stream, cat [text, image]
    qk_wan_*              torch.nn.RMSNorm across heads, unflatten, Wan's      Wan 2.1 / 2.2
                          interleaved apply_rotary_emb
    qk_ltx_*              torch.nn.RMSNorm across heads, then                  LTX-2 (rope_type
                          apply_interleaved_rotary_emb (frequencies over the   "interleaved")
                          whole width) or apply_split_rotary_emb (rotate-half   "split": the released
                          pairs, a set of frequencies a head)                   checkpoints)
    qk_glm_*              nn.LayerNorm per head (aten's), then apply_rotary_emb GLM-Image
                          (use_real_unbind_dim=-2: rotate-half) on the image
                          slice of the joint [text, image] q / k: the split
                          kernel once a half of the [S, D] tables
    qk_minimax_*          torch.nn.RMSNorm per head (aten's), then             MiniMax-H3
                          _apply_rotary_emb: rotate-half on the leading R
                          channels of each head, the rest passed through: the
                          split kernel once a half of the [S, R] tables (fp32),
                          or the real-pair kernel on the channels copied as
                          adjacent pairs, tables in x's dtype (bf16's rounded
                          products, as eager's `.to(dtype)` tables give)

Each comes as variants the rule tries in order (the verifier keeps the first equal to eager):
`*_fused` normalises in the kernel in aten's fused-RMSNorm order (unproven: GPU only), `*_mean`
in aten's mean order (proven on the H200 for rows of 128), `*_aten` lets aten's norm module run
and fuses the rest (the rotation, the concatenation: exact elementwise fp32). The complex product
has a contraction mode (kernels_rope.CMUL_MODES): `fma_ac_ad` is the H200's; `plain` is the CPU's
(the only one with a plain-torch plan), tried last. LTX-2's split RoPE runs `x * cos`, then
`addcmul_(±sin, other half)`, and aten's addcmul at value 1 is one FMA, `fma(t1, t2, self)`, on
CUDA (ATen/native/cuda/DeviceAddCmulCdiv.cuh) and in the CPU build: `fma_bd_ad` (the sin products
exact in the sum; its plan adds in float64: exact products, one rounding but for a double rounding
once in ~2^28 elements) is tried first, `plain` (each product rounded) last. The order matters
beyond speed: the two differ in ~2 of 10^5 bf16 outputs, so a small first-sight input can pass the
wrong one, which then differs on a later prompt (the LTX-2 job's item v07 at f0ab108).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from .applicable import check
from .ops import Op, _r, register
from .protocols import RMSNorm


def _kr():
    from . import kernels_rope

    return kernels_rope


def _torch_rms(norm: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor | None, float]:
    """(weight, eps) of a torch.nn.RMSNorm over x's last dim as F.rms_norm runs it."""
    check(isinstance(norm, nn.RMSNorm) and len(norm.normalized_shape) == 1, "not a torch.nn.RMSNorm over one dim")
    check(norm.weight is None or norm.weight.dtype == x.dtype, "the norm's weight dtype differs from its input's")
    assert isinstance(norm, nn.RMSNorm)  # the first check
    return norm.weight, (norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps)


def _diffusers_rms(norm: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor | None, float]:
    check(type(norm).__name__ == "RMSNorm" and not isinstance(norm, nn.RMSNorm) and norm.bias is None,
          "not a diffusers RMSNorm without bias")
    check(norm.weight is None or norm.weight.dtype == x.dtype, "the norm's weight dtype differs from its input's")
    rms = cast(RMSNorm, norm)  # the first check (nn.Module types its attributes Tensor | Module)
    return rms.weight, rms.eps


def _joint_out(xs: tuple) -> torch.Tensor:
    B, _, H, D = xs[0].shape
    check(all(x.shape[0] == B and x.shape[2:] == (H, D) and x.dtype == xs[0].dtype for x in xs),
          "the streams differ in batch, heads, head dim or dtype")
    return torch.empty((B, sum(x.shape[1] for x in xs), H, D), dtype=xs[0].dtype, device=xs[0].device)


def _pairs_plan(n: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: tuple) -> torch.Tensor:
    """The kernel's rotation in plain torch: even = a*cos[CE] - b*sin[SE], odd = b*cos[CO] + a*sin[SO],
    for n [B, S, H, D] and cos / sin [S, D] (or [B|1, S, D]), in fp32 (fp32 cos / sin) or each op rounded
    to n's dtype (cos / sin in it)."""
    a, b = n.float()[..., 0::2], n.float()[..., 1::2]
    c, s = (t[None, :, None, :].float() if t.dim() == 2 else t[:, :, None, :].float() for t in (cos, sin))
    ce, se, co, so = (t[..., i::2] for t, i in zip((c, s, c, s), index))
    if cos.dtype == torch.float32:
        return torch.stack([a * ce - b * se, b * co + a * so], dim=-1).flatten(3).to(n.dtype)
    dt = n.dtype
    even = _r(_r(a * ce, dt) - _r(b * se, dt), dt)
    odd = _r(_r(b * co, dt) + _r(a * so, dt), dt)
    return torch.stack([even, odd], dim=-1).flatten(3).to(dt)


# -- Flux / LongCat: norm per head (torch.nn.RMSNorm), cat [text, image], real pairs ----------------
def _pairs_eager(xs: tuple, norms: tuple, freqs: tuple) -> torch.Tensor:
    from diffusers.models.embeddings import apply_rotary_emb

    q = torch.cat([n(x) for x, n in zip(xs, norms)], dim=1) if len(xs) > 1 else norms[0](xs[0])
    # the ignore: diffusers annotates apply_rotary_emb -> tuple; with use_real (the default) it returns one tensor
    return apply_rotary_emb(q, freqs, sequence_dim=1)  # type: ignore[return-value]


def _pairs_reference(norm: str):
    def reference(xs, norms, freqs):
        check(norm == "aten", "aten's fused RMSNorm order is the GPU's (no plain-torch plan)")
        cos, sin = freqs
        outs, t0 = [], 0
        for x, n in zip(xs, norms):
            outs.append(_pairs_plan(n(x), cos[t0:t0 + x.shape[1]], sin[t0:t0 + x.shape[1]], (0, 0, 1, 1)))
            t0 += x.shape[1]
        return torch.cat(outs, dim=1)

    return reference


def _pairs_fused(norm: str):
    def fused(xs, norms, freqs):
        kr = _kr()
        cos, sin = freqs
        check(cos.dim() == 2 and cos.shape[0] == sum(x.shape[1] for x in xs), "cos / sin must be [S_total, D]")
        out, t0 = _joint_out(xs), 0
        for x, n in zip(xs, norms):
            f = (cos[None, t0:t0 + x.shape[1]], sin[None, t0:t0 + x.shape[1]])
            if norm == "fused":
                w, eps = _torch_rms(n, x)
                kr.rope(x, f, kr.Rope("pairs", index=kr.FLUX_INDEX), out, t0, norm="fused", weight=w, eps=eps)
            else:
                kr.rope(n(x), f, kr.Rope("pairs", index=kr.FLUX_INDEX), out, t0)
            t0 += x.shape[1]
        return out

    return fused


QK_PAIRS = tuple(register(Op(f"qk_pairs_{n}", _pairs_eager, _pairs_reference(n), _pairs_fused(n)))
                 for n in ("fused", "aten"))


# -- Qwen-Image: diffusers RMSNorm per head, complex RoPE per stream, cat [text, image] ---------------
def _complex_eager(xs: tuple, norms: tuple, freqs: tuple) -> torch.Tensor:
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    # the ignore: diffusers annotates apply_rotary_emb_qwen -> tuple; with use_real=False it returns one tensor
    return torch.cat([apply_rotary_emb_qwen(n(x), f, use_real=False)  # type: ignore[misc]
                      for x, n, f in zip(xs, norms, freqs)], dim=1)


def _complex_reference(norm: str, mode: str):
    def reference(xs, norms, freqs):
        check(mode == "plain", f"the {mode} contraction is the GPU's (no FMA in the plain-torch plan)")
        outs = []
        for x, n, f in zip(xs, norms, freqs):
            # norm "mean" on the CPU: aten's CPU mean is the plan's variance (the kernel's is the GPU's)
            y = n(x).float()
            a, b = y[..., 0::2], y[..., 1::2]
            fr = torch.view_as_real(f)[None, :, None]
            c, d = fr[..., 0], fr[..., 1]
            outs.append(torch.stack([a * c - b * d, a * d + b * c], dim=-1).flatten(3).to(x.dtype))
        return torch.cat(outs, dim=1)

    return reference


def _complex_fused(norm: str, mode: str):
    def fused(xs, norms, freqs):
        kr = _kr()
        out, t0 = _joint_out(xs), 0
        for x, n, f in zip(xs, norms, freqs):
            check(f.dim() == 2, "freqs must be complex64 [S, D/2]")
            if norm == "mean":
                w, eps = _diffusers_rms(n, x)
                kr.rope(x, f[None], kr.Rope("complex", mode), out, t0, norm="mean", weight=w, eps=eps)
            else:
                kr.rope(n(x), f[None], kr.Rope("complex", mode), out, t0)
            t0 += x.shape[1]
        return out

    return fused


QK_COMPLEX = tuple(register(Op(f"qk_complex_{n}_{m}", _complex_eager, _complex_reference(n, m), _complex_fused(n, m)))
                   for n, m in (("mean", "fma_ac_ad"), ("aten", "fma_ac_ad"), ("mean", "plain"), ("aten", "plain")))


# -- Wan: torch.nn.RMSNorm across heads, then WanAttnProcessor's interleaved RoPE ---------------------
def _wan_rotary(hidden_states: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    # WanAttnProcessor.__call__'s apply_rotary_emb, op for op
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def _wan_eager(x: torch.Tensor, norm: nn.Module, heads: int, freqs: tuple) -> torch.Tensor:
    return _wan_rotary(norm(x).unflatten(2, (heads, -1)), *freqs)


def _wan_freqs(freqs: tuple, S: int, D: int) -> tuple:
    cos, sin = freqs
    check(cos.dim() == 4 and cos.shape[0] == 1 and cos.shape[1] == S and cos.shape[2] == 1 and cos.shape[3] == D,
          "Wan's cos / sin must be [1, S, 1, D]")
    return cos[:, :, 0], sin[:, :, 0]


def _wan_reference(norm: str):
    def reference(x, n, heads, freqs):
        check(norm == "aten", "aten's fused RMSNorm order is the GPU's (no plain-torch plan)")
        y = n(x).unflatten(2, (heads, -1))
        cos, sin = _wan_freqs(freqs, y.shape[1], y.shape[3])
        return _pairs_plan(y, cos[0], sin[0], (0, 1, 0, 1))

    return reference


def _wan_fused(norm: str):
    def fused(x, n, heads, freqs):
        kr = _kr()
        check(x.dim() == 3 and x.shape[2] % heads == 0, "x must be [B, S, heads * D]")
        B, S, HD = x.shape
        f = _wan_freqs(freqs, S, HD // heads)
        rope = kr.Rope("pairs", index=kr.WAN_INDEX)
        if norm == "fused":
            w, eps = _torch_rms(n, x)
            return kr.rope(x.unflatten(2, (heads, -1)), f, rope, norm="fused", weight=w, eps=eps, across_heads=True)
        return kr.rope(n(x).unflatten(2, (heads, -1)), f, rope)

    return fused


QK_WAN = tuple(register(Op(f"qk_wan_{n}", _wan_eager, _wan_reference(n), _wan_fused(n))) for n in ("fused", "aten"))


# -- LTX-2: torch.nn.RMSNorm across heads, then LTX2AudioVideoAttnProcessor's interleaved or split RoPE ---
def _ltx_eager(split: bool):
    def eager(x: torch.Tensor, norm: nn.Module, freqs: tuple) -> torch.Tensor:
        from diffusers.models.transformers import transformer_ltx2 as T

        rotate = T.apply_split_rotary_emb if split else T.apply_interleaved_rotary_emb
        return rotate(norm(x), freqs)

    return eager


def _ltx_freqs(x: torch.Tensor, freqs: tuple, split: bool) -> tuple[int, tuple]:
    """(heads the rotation sees, (cos, sin) as the kernel reads them) for x [B, S, H * D]. Interleaved:
    cos / sin [B|1, S, H * D] pair adjacent elements anywhere in the row, so the row is one head. Split:
    [B, H, S, D/2] (a set a head: the token axis moved before the head axis, a view) or [B|1, S, W/2]
    (one split of the whole row)."""
    cos, sin = freqs
    check(x.dim() == 3 and cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape,
          "x must be [B, S, H * D], cos / sin fp32 of one shape (eager computes in fp32)")
    B, S, W = x.shape
    if split and cos.dim() == 4:
        check(cos.shape[0] == B and cos.shape[2] == S and cos.shape[1] * cos.shape[3] * 2 == W,
              "split cos / sin must be [B, H, S, D/2]")
        return cos.shape[1], (cos.transpose(1, 2), sin.transpose(1, 2))
    check(cos.dim() == 3 and cos.shape[0] in (1, B) and cos.shape[1:] == (S, W // 2 if split else W),
          "cos / sin must be [B|1, S, W] (split: W / 2)")
    return 1, (cos, sin)


def _split_plan(n: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str) -> torch.Tensor:
    """The kernel's split rotation in plain torch for n [B, S, H, D], cos / sin [B|1, S, H or 1, D/2]:
    first = a*c - b*s, second = b*c + a*s, each product rounded (`plain`) or the second product exact
    in the sum (`fma_bd_ad`, in float64)."""
    y = n.float()
    a, b = y.chunk(2, dim=-1)
    if mode == "plain":
        first, second = a * cos - b * sin, b * cos + a * sin
    else:
        first = ((a * cos).double() - b.double() * sin.double()).float()
        second = ((b * cos).double() + a.double() * sin.double()).float()
    return torch.cat([first, second], dim=-1).to(n.dtype)


def _ltx_reference(split: bool, norm: str, mode: str):
    def reference(x, n, freqs):
        check(norm == "aten", "aten's fused RMSNorm order is the GPU's (no plain-torch plan)")
        heads, (cos, sin) = _ltx_freqs(x, freqs, split)
        y = n(x).unflatten(2, (heads, -1))
        if not split:
            return _pairs_plan(y, cos, sin, (0, 0, 1, 1)).flatten(2)
        c, s = (t if t.dim() == 4 else t[:, :, None] for t in (cos, sin))
        return _split_plan(y, c, s, mode).flatten(2)

    return reference


def _ltx_fused(split: bool, norm: str, mode: str):
    def fused(x, n, freqs):
        kr = _kr()
        heads, f = _ltx_freqs(x, freqs, split)
        rope = kr.Rope("split", mode) if split else kr.Rope("pairs", index=kr.FLUX_INDEX)
        if norm == "fused":
            w, eps = _torch_rms(n, x)
            out = kr.rope(x.unflatten(2, (heads, -1)), f, rope, norm="fused", weight=w, eps=eps, across_heads=True)
        else:
            out = kr.rope(n(x).unflatten(2, (heads, -1)), f, rope)
        return out.flatten(2)

    return fused


QK_LTX = tuple(register(Op(f"qk_ltx_interleaved_{n}", _ltx_eager(False), _ltx_reference(False, n, "plain"),
                           _ltx_fused(False, n, "plain"))) for n in ("fused", "aten"))
QK_LTX_SPLIT = tuple(register(Op(f"qk_ltx_split_{n}_{m}", _ltx_eager(True), _ltx_reference(True, n, m),
                                 _ltx_fused(True, n, m)))
                     for n, m in (("fused", "fma_bd_ad"), ("aten", "fma_bd_ad"), ("fused", "plain"), ("aten", "plain")))


# -- GLM-Image: nn.LayerNorm per head over the joint [text, image] q / k, then apply_rotary_emb
# (use_real_unbind_dim=-2: rotate-half) on the image tokens, written into their slice ----------------
def _glm_eager(x: torch.Tensor, norm: nn.Module, text: int, freqs: tuple) -> torch.Tensor:
    # GlmImageAttnProcessor.__call__, op for op (its `.to(dtype)` after the norm: the caller's, a no-op
    # where the streams share a dtype, which the rule requires)
    from diffusers.models.embeddings import apply_rotary_emb

    n = norm(x)
    n[:, text:, :, :] = apply_rotary_emb(n[:, text:, :, :], freqs, sequence_dim=1, use_real_unbind_dim=-2)
    return n


def _glm_halves(n: torch.Tensor, text: int, freqs: tuple) -> tuple:
    """((cos, sin) of the first halves, (cos, sin) of the second halves), each [1, S, D/2], of GLM's
    [S, D] tables: rotate-half's first element of a pair (j) reads cos[j] / sin[j], its second (j + D/2)
    cos[j + D/2] / sin[j + D/2]. The kernel's split layout reads one value a pair, so each half is a call
    (no assumption on the values: GlmImageRotaryPosEmbed's halves repeat, a table passed in need not)."""
    cos, sin = freqs
    B, S, H, D = n.shape
    check(isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.dtype == sin.dtype == torch.float32
          and cos.shape == sin.shape == (S - text, D), "cos / sin must be fp32 [S_image, D]")
    cos, sin = cos.to(n.device), sin.to(n.device)  # as apply_rotary_emb moves them (the model makes a host table)
    h = D // 2
    return (cos[None, :, :h], sin[None, :, :h]), (cos[None, :, h:], sin[None, :, h:])


def _glm_reference(mode: str):
    def reference(x, norm, text, freqs):
        check(mode == "plain", f"the {mode} contraction has no plain-torch plan here")
        n = norm(x)
        first, second = _glm_halves(n, text, freqs)
        h = n.shape[3] // 2
        y = n[:, text:]
        out = n.clone()
        out[:, text:, :, :h] = _split_plan(y, first[0][:, :, None], first[1][:, :, None], "plain")[..., :h]
        out[:, text:, :, h:] = _split_plan(y, second[0][:, :, None], second[1][:, :, None], "plain")[..., h:]
        return out

    return reference


def _glm_fused(mode: str):
    def fused(x, norm, text, freqs):
        kr = _kr()
        n = norm(x)  # aten's LayerNorm (no kernel of ours has its order per head): a new contiguous tensor
        first, second = _glm_halves(n, text, freqs)
        check(n.dim() == 4 and n.is_contiguous(), "the norm's output must be a contiguous [B, S, H, D]")
        h = n.shape[3] // 2
        rope = kr.Rope("split", mode)
        y = n[:, text:].contiguous()  # the image rows (a copy, but at batch 1 a view of n)
        lo = kr.rope(y, first, rope)  # its first halves are eager's (a new tensor: y is read unedited)
        # the second halves, written into n's image slice (at batch 1 in place: each pair is read and
        # written by one program), then the first halves over them
        kr.rope(y, second, rope, n, text)
        n[:, text:, :, :h] = lo[..., :h]
        return n

    return fused


QK_GLM = tuple(register(Op(f"qk_glm_split_{m}", _glm_eager, _glm_reference(m), _glm_fused(m))) for m in ("plain",))


# -- MiniMax-H3: torch.nn.RMSNorm per head (aten's), then _apply_rotary_emb: rotate-half on the leading
# `rotary_dim` channels of each head (cos / sin [S, rotary_dim], cast to x's dtype), the rest passed through ---
def _minimax_eager(x: torch.Tensor, norm: nn.Module, freqs: tuple) -> torch.Tensor:
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    return _apply_rotary_emb(norm(x), *freqs)


def _minimax_halves(n: torch.Tensor, freqs: tuple) -> tuple[int, tuple, tuple]:
    """(rotary_dim, (cos, sin) of the tables' first halves, of their second halves), each [1, S, R/2].
    Eager casts the tables to x's dtype and runs `x * cos + rotated * sin` as separate ops: in fp32 each
    product and the sum rounded to fp32, the kernel's `plain` split; in bf16 each product rounded to
    bf16, which no shared kernel's split does (its tables are fp32): not applicable."""
    cos, sin = freqs
    check(n.dim() == 4 and n.dtype == torch.float32, "x must be an fp32 [B, S, H, D] (bf16 products: no kernel)")
    B, S, H, D = n.shape
    check(isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.dtype == sin.dtype == torch.float32
          and cos.dim() == 2 and cos.shape == sin.shape and cos.shape[0] == S and cos.shape[1] % 2 == 0
          and 0 < cos.shape[1] <= D and cos.device == n.device, "cos / sin must be fp32 [S, R], R even, R <= D")
    R = cos.shape[1]
    h = R // 2
    return R, (cos[None, :, :h], sin[None, :, :h]), (cos[None, :, h:], sin[None, :, h:])


def _minimax_reference(mode: str):
    def reference(x, norm, freqs):
        check(mode == "plain", f"the {mode} contraction has no plain-torch plan here")
        n = norm(x)
        R, first, second = _minimax_halves(n, freqs)
        h = R // 2
        y = n[..., :R]
        lo = _split_plan(y, first[0][:, :, None], first[1][:, :, None], "plain")[..., :h]
        hi = _split_plan(y, second[0][:, :, None], second[1][:, :, None], "plain")[..., h:]
        return torch.cat([lo, hi, n[..., R:]], dim=-1)

    return reference


def _minimax_fused(mode: str):
    def fused(x, norm, freqs):
        kr = _kr()
        n = norm(x)  # aten's RMSNorm over the whole head (the rotation covers only its leading R channels)
        R, first, second = _minimax_halves(n, freqs)
        h = R // 2
        rope = kr.Rope("split", mode)
        y = n[..., :R].contiguous()  # the rotary channels (a copy: the kernel reads contiguous heads)
        lo = kr.rope(y, first, rope)  # first halves: eager's; second halves from the tables' second halves
        hi = kr.rope(y, second, rope)
        return torch.cat([lo[..., :h], hi[..., h:], n[..., R:]], dim=-1)

    return fused


QK_MINIMAX = tuple(register(Op(f"qk_minimax_split_{m}", _minimax_eager, _minimax_reference(m), _minimax_fused(m)))
                   for m in ("plain",))


# -- MiniMax-H3 in any dtype: the same chain through the kernel's real-pair style, the rotary channels laid
# out as adjacent pairs (x1_j, x2_j) (one copy) and the tables' cast to x's dtype (eager's `.to(dtype)`)
# interleaved alike: each product and the sum rounded to x's dtype (fp32 tables: to fp32), as eager's
# separate mul / mul / add do; rotate-half's `x1 * c + (-x2) * s` is `a*c - b*s`, bit for bit ----------------
def _minimax_pairs_layout(n: torch.Tensor, freqs: tuple) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R, the rotary channels as adjacent pairs [B, S, H, R] contiguous, cos, sin [S, R] of n's dtype, each
    pair's (j, j + R/2) values adjacent)."""
    cos, sin = freqs
    check(n.dim() == 4 and isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)
          and cos.dtype == sin.dtype == torch.float32 and cos.dim() == 2 and cos.shape == sin.shape
          and cos.shape[0] == n.shape[1] and cos.shape[1] % 2 == 0 and 0 < cos.shape[1] <= n.shape[3]
          and cos.device == n.device, "cos / sin must be fp32 [S, R], R even, R <= D")
    R = cos.shape[1]
    h = R // 2

    def pairs(t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (2, h)).transpose(-1, -2).flatten(-2)

    y = n[..., :R].unflatten(-1, (2, h)).transpose(-1, -2).contiguous().flatten(-2)
    return R, y, pairs(cos.to(n.dtype)), pairs(sin.to(n.dtype))


def _minimax_unpair(out: torch.Tensor, n: torch.Tensor, R: int) -> torch.Tensor:
    o = out.unflatten(-1, (R // 2, 2))
    return torch.cat([o[..., 0], o[..., 1], n[..., R:]], dim=-1)


def _minimax_pairs_reference(x, norm, freqs):
    n = norm(x)
    R, y, c, s = _minimax_pairs_layout(n, freqs)
    return _minimax_unpair(_pairs_plan(y, c, s, (0, 0, 1, 1)), n, R)


def _minimax_pairs_fused(x, norm, freqs):
    kr = _kr()
    n = norm(x)
    R, y, c, s = _minimax_pairs_layout(n, freqs)
    return _minimax_unpair(kr.rope(y, (c[None], s[None]), kr.Rope("pairs", index=kr.FLUX_INDEX)), n, R)


QK_MINIMAX_PAIRS = (register(Op("qk_minimax_pairs", _minimax_eager, _minimax_pairs_reference, _minimax_pairs_fused)),)
