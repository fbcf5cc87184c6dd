"""MiniMax-H3: `MiniMaxH3TransformerBlock.forward` with its elementwise chains fused, and the final
`MiniMaxH3AdaLayerNormOut` (diffusers 0.42 source: MiniMaxH3TransformerBlock, MiniMaxH3AttnProcessor,
MiniMaxH3AdaLayerNormModulation, _apply_rotary_emb).

One packed sequence [text | audio | video] in the block stack's dtype; torch.nn.RMSNorms (with a
weight) before attention and feed-forward, each followed by adaLN whose parameters are selected per
row of the sequence (`table.index_select(0, adaln_indices)`: [S, D], one row a token, the same for
every batch item), per-head torch.nn.RMSNorm q / k norms, rotate-half RoPE on the leading
`rotary_dim` channels of each head (the rest passed through), gated residuals, a SwiGLU
feed-forward. Chains fused, each verified on first sight:

    chain                                      eager kernels -> fused                   where
    adaLN after norm1 / norm2                  3 -> 1 each (the norm: aten's)           adaln
      n * (1 + scale[idx]) + shift[idx]
    gated residuals  h + gate[idx] * y         2 -> 1 each                              gated_residual
    q / k  RMSNorm per head, then              ~8 -> 4 each: aten's norm, the rotary    qk_minimax_split_plain
      _apply_rotary_emb (rotate-half on the    channels made contiguous, the split      (fp32),
      leading R channels, fp32 tables cast     kernel (kernels_rope) once a half of
      to x's dtype, separate mul/mul/add)      the tables, one cat;
                                               any dtype: the rotary channels copied    qk_minimax_pairs
                                               as adjacent pairs (x1_j, x2_j), the      (bf16, fp16; fp32's
                                               real-pair kernel with the tables cast    fallback)
                                               to x's dtype and laid out alike (each
                                               product and the sum rounded to x's
                                               dtype, as eager's bf16 ops), one cat
    norm_out  norm(x) * (1 + scale[idx])       3 -> 1 (the norm: aten's)                adaln
      + shift[idx]

Where the fused chains apply: the modulation kernels read one [D] row per item of a [B, N, D] input
(`scale` broadcast over tokens); a per-token table fits that only at batch 1, where x [1, S, D] is
viewed as [S, 1, D] with a zero token stride (the same elements, the same arithmetic): batch > 1 runs
eager's three ops. The rotation in bf16 rounds each product to bf16 (eager casts the tables to x's
dtype); the split kernel reads fp32 tables only, the real-pair kernel takes tables in x's dtype and
rounds as eager does, on adjacent pairs: hence the pair layout's copy there.

Left as the module's own calls: every GEMM (the Linear modules, the modulation projection included),
the torch.nn.RMSNorms (aten's fused RMSNorm; no kernel of ours has its order with a weight and adaLN
after it), the attention kernel (dispatch_attention_fn, with bcg's attention breaks kept), the
SwiGLU feed-forward whole (its halves are chunks of one GEMM: the shared SwiGLU kernel reads
contiguous operands), the index_selects, and the token refiner's blocks (plain pre-norm blocks
without RoPE or modulation: norm, attention, add; nothing elementwise to merge). Calls the forward
does not cover run the class's forward: rotary tables that are not a (cos, sin) pair, and an
attention module wrapped by something else than bcg's breaks.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, cast

import torch
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .ops import ADALN, GATED_RESIDUAL
from .ops_rope import QK_MINIMAX, QK_MINIMAX_PAIRS
from .protocols import Attention
from .verify import Verifier, chain


class _MiniMaxAttention(Attention, Protocol):
    fused_projections: bool
    to_qkv: nn.Module
    norm_q: nn.Module
    norm_k: nn.Module


class _Block(Protocol):
    """MiniMaxH3TransformerBlock as the fused forward reads it (check_block pins its children)."""

    norm1: nn.Module
    attn: _MiniMaxAttention
    norm2: nn.Module
    ff: nn.Module
    adaln_proj: nn.Module


def _plain_rms(norm: object) -> bool:
    return isinstance(norm, nn.RMSNorm) and "forward" not in norm.__dict__ \
        and getattr(norm, "_diffusers_hook", None) is None


def check_block(block: nn.Module) -> str | None:
    try:
        from diffusers.models.transformers import transformer_minimax_h3 as T
    except ImportError as exc:
        return f"diffusers lacks the MiniMax-H3 classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    attn = getattr(block, "attn", None)
    if attn is None or type(attn.processor) is not T.MiniMaxH3AttnProcessor:
        return "attn does not use MiniMaxH3AttnProcessor"
    if not (_plain_rms(attn.norm_q) and _plain_rms(attn.norm_k)):
        return "attn's q / k norms are not plain torch.nn.RMSNorms"
    if not (_plain_rms(getattr(block, "norm1", None)) and _plain_rms(getattr(block, "norm2", None))):
        return "norm1 / norm2 are not plain torch.nn.RMSNorms (a hook: layerwise casting, offloading)"
    proj = getattr(block, "adaln_proj", None)
    if type(proj) is not T.MiniMaxH3AdaLayerNormModulation or "forward" in proj.__dict__:
        return "adaln_proj is not a plain MiniMaxH3AdaLayerNormModulation"
    return None


def _per_row(x: torch.Tensor, *mods: torch.Tensor) -> bool:
    """x [1, S, D] and per-row [S, D] parameters of its dtype: the kernels' [B, 1, D] layout as a view."""
    return (x.dim() == 3 and x.shape[0] == 1 and x.is_contiguous()
            and all(m.shape == x.shape[1:] and m.dtype == x.dtype and m.is_contiguous() for m in mods))


def _row(m: torch.Tensor) -> torch.Tensor:
    """[S, D] as [S, 1, D] with a zero token stride: the kernels' "broadcast over tokens" layout (one row
    an item), the same elements."""
    S, D = m.shape
    return m.as_strided((S, 1, D), (D, 0, 1))


def adaln_rows(call: Callable, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x * (1 + scale) + shift for per-row scale / shift [S, D] (eager's `1.0 + scale`: the same add)."""
    if not _per_row(x, scale, shift):
        return x * (1.0 + scale) + shift
    _, S, D = x.shape
    return call(ADALN, x.view(S, 1, D), _row(scale), _row(shift)).view(1, S, D)


def gated_residual_rows(call: Callable, h: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """h + gate * y for a per-row gate [S, D]."""
    if not (_per_row(h, gate) and y.shape == h.shape and y.dtype == h.dtype and y.is_contiguous()):
        return h + gate * y
    _, S, D = h.shape
    return call(GATED_RESIDUAL, h.view(S, 1, D), _row(gate), y.view(S, 1, D)).view(1, S, D)


def _attention(qk: dict[bool, Callable], attn: _MiniMaxAttention, hidden: torch.Tensor, rotary: tuple | None,
               mask: torch.Tensor | None) -> torch.Tensor:
    """MiniMaxH3AttnProcessor, op for op, its q / k norm + RoPE fused (`qk[fp32]`: the chain for the dtype)."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    if attn.fused_projections:
        query, key, value = attn.to_qkv(hidden).chunk(3, dim=-1)
    else:
        query, key, value = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
    query, key, value = (t.unflatten(-1, (attn.heads, -1)) for t in (query, key, value))
    if rotary is not None:
        rotate = qk[query.dtype == torch.float32]
        query, key = rotate(query, attn.norm_q, rotary), rotate(key, attn.norm_k, rotary)
    else:
        query, key = attn.norm_q(query), attn.norm_k(key)
    proc = attn.processor
    with kernel_breaks(attn):
        out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                    backend=proc._attention_backend, parallel_config=proc._parallel_config)
    out = out.flatten(2, 3).type_as(query)
    return attn.to_out[1](attn.to_out[0](out))


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    b = cast(_Block, block)  # check_block pinned its children (nn.Module types them Tensor | Module)
    # fp32: the split kernel (no copy of the rotary channels into pairs) first; bf16 / fp16: the pairs' plan only
    qk = {True: chain(call, QK_MINIMAX + QK_MINIMAX_PAIRS), False: chain(call, QK_MINIMAX_PAIRS)}
    class_forward = type(block).forward
    attn = b.attn

    def forward(hidden_states, temb, adaln_indices, rotary_emb, attention_mask=None):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = b.adaln_proj(temb)

        residual = hidden_states
        norm_h = adaln_rows(call, b.norm1(hidden_states), scale_msa.index_select(0, adaln_indices),
                            shift_msa.index_select(0, adaln_indices))
        attn_output = _attention(qk, attn, norm_h, rotary_emb, attention_mask)
        hidden_states = gated_residual_rows(call, residual, gate_msa.index_select(0, adaln_indices), attn_output)

        residual = hidden_states
        norm_h = adaln_rows(call, b.norm2(hidden_states), scale_mlp.index_select(0, adaln_indices),
                            shift_mlp.index_select(0, adaln_indices))
        ff_output = b.ff(norm_h)
        return gated_residual_rows(call, residual, gate_mlp.index_select(0, adaln_indices), ff_output)

    verified = guarded("minimax_h3_block", block, forward, fx)

    def route(hidden_states, temb, adaln_indices, rotary_emb, attention_mask=None):
        """Calls the fused forward covers go to it (verified as a whole); the others to the class's forward."""
        rotary_ok = rotary_emb is None or (isinstance(rotary_emb, tuple) and len(rotary_emb) == 2
                                           and all(isinstance(t, torch.Tensor) for t in rotary_emb))
        if not rotary_ok or not inlinable(attn):
            return class_forward(block, hidden_states, temb, adaln_indices, rotary_emb, attention_mask)
        return verified(hidden_states, temb, adaln_indices, rotary_emb, attention_mask)

    route.__bcg_fusion__ = "minimax_h3_block"  # type: ignore[attr-defined]
    route.__wrapped__ = forward  # type: ignore[attr-defined]
    return route


def check_norm_out(norm: nn.Module) -> str | None:
    if "forward" in norm.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if not _plain_rms(getattr(norm, "norm", None)):
        return "its norm is not a plain torch.nn.RMSNorm"
    return None


def norm_out_forward(module: nn.Module, fx: Verifier) -> Callable:
    """MiniMaxH3AdaLayerNormOut, op for op, its modulation one kernel (batch 1, one dtype)."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    call = fx.call
    linear, norm = cast(Any, module).linear, cast(Any, module).norm

    def forward(hidden_states, temb, timestep_indices):
        shift, scale = linear(nn.functional.silu(temb).to(get_parameter_dtype(linear))).chunk(2, dim=-1)
        return adaln_rows(call, norm(hidden_states), scale.index_select(0, timestep_indices),
                          shift.index_select(0, timestep_indices))

    return guarded("minimax_h3_norm_out", module, forward, fx)


OPS = (ADALN.name, GATED_RESIDUAL.name, *(op.name for op in QK_MINIMAX + QK_MINIMAX_PAIRS))
NORM_OUT_OPS = (ADALN.name,)
