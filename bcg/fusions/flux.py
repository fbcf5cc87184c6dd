"""Flux and LongCat-Image: the double-stream and single-stream blocks with their elementwise chains
fused (diffusers 0.42 source: FluxTransformerBlock, FluxSingleTransformerBlock, FluxAttnProcessor;
LongCat-Image's LongCatImage* blocks are the same code under other names, except that its
processor hands `to_out` the attention output's slices as they are, where Flux makes them
contiguous first).

Per double-stream block, eager runs ~55 elementwise and copy kernels around its 12 GEMMs and one
attention; the fused forward ~12, every chain verified on first sight:

    norm1 / norm1_context   LN(x) * (1 + scale) + shift                 4 -> 1 each (kernels_norm)
                            SiLU(temb) for the modulation linears        once a forward (not 2 a block)
    q / k                   RMSNorm per head, cat [text, image], RoPE   ~11 -> 2 each: one kernel a stream
                            (its real pairs in fp32)                    writes its slice of the joint q / k
    residual + norm2        h + gate * attn; LN + adaLN                  6 -> 1 each stream
    residual                h + gate * ff                                2 -> 1 each stream

Per single-stream block:

    cat [text, image]       the previous block's two halves are views of one tensor: that tensor
    norm                    LN + adaLN                                   4 -> 1
    q / k                   RMSNorm + RoPE                               ~10 -> 1 each
    act + cat               cat([attn, gelu_tanh(mlp)], dim=2)           2 -> 1 (kernels_act)
    residual                residual + gate * proj_out(..)               2 -> 1

GEMMs (every Linear is the module's own call), the attention kernel (dispatch_attention_fn, with
bcg's attention breaks kept) and the feed-forwards stay aten's. Calls with joint_attention_kwargs
(IP adapters and other processors) run the class's forward. Each rewritten forward is verified
against the block's own forward on first sight of its input key (guard.py).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .modulation import SameInput
from .ops import GATED_RESIDUAL
from .ops_act import GELU_CAT
from .ops_norm import gated_res_ln_adaln, ln_adaln
from .ops_rope import QK_PAIRS
from .protocols import Attention
from .verify import Verifier, chain

FAMILIES = ("Flux", "LongCatImage")  # class-name prefixes: <prefix>TransformerBlock, <prefix>SingleTransformerBlock


class _FluxAttention(Attention, Protocol):
    """FluxAttention / LongCatImageAttention as their processors read them (torch.nn.RMSNorm q/k
    norms, always there; the text stream's in the double-stream blocks)."""

    head_dim: int
    norm_q: nn.Module
    norm_k: nn.Module
    norm_added_q: nn.Module
    norm_added_k: nn.Module
    to_add_out: nn.Module


def _module(prefix: str):
    if prefix == "Flux":
        from diffusers.models.transformers import transformer_flux

        return transformer_flux
    from diffusers.models.transformers import transformer_longcat_image

    return transformer_longcat_image


def _prefix(block: nn.Module) -> str:
    name = type(block).__name__
    return next(p for p in FAMILIES if name.startswith(p))


def _plain_ln(norm: object) -> bool:
    return isinstance(norm, nn.LayerNorm) and norm.weight is None and norm.bias is None


def _check_common(block: nn.Module, norms: tuple[str, ...]) -> str | None:
    try:
        mod = _module(_prefix(block))
        processor = getattr(mod, f"{_prefix(block)}AttnProcessor")
    except (ImportError, AttributeError, StopIteration) as exc:
        return f"diffusers lacks the {type(block).__name__} classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    attn = getattr(block, "attn", None)
    if attn is None or type(attn.processor) is not processor:
        return f"attn does not use {processor.__name__} (an IP adapter or another processor)"
    for name in norms:
        ada = getattr(block, name, None)
        if ada is None or type(ada).__name__ not in ("AdaLayerNormZero", "AdaLayerNormZeroSingle") \
                or getattr(ada, "emb", None) is not None or not _plain_ln(ada.norm) or "forward" in ada.__dict__:
            return f"{name} is not a plain AdaLayerNormZero(Single) over an affine-free LayerNorm"
    return None


def check_block(block: nn.Module) -> str | None:
    why = _check_common(block, ("norm1", "norm1_context"))
    if why is None and not (_plain_ln(block.norm2) and _plain_ln(block.norm2_context)):
        why = "norm2 / norm2_context are not affine-free LayerNorms"
    return why


def check_single(block: nn.Module) -> str | None:
    why = _check_common(block, ("norm",))
    if why is None and not (isinstance(block.act_mlp, nn.GELU) and block.act_mlp.approximate == "tanh"):
        why = "act_mlp is not GELU(approximate='tanh')"
    return why


def _silu(fx: Verifier) -> SameInput:
    """SiLU(temb), once a forward for every block's modulation linear (the same op on the same tensor)."""
    return fx.shared.setdefault("flux_silu", SameInput(F.silu))


def _heads(x: torch.Tensor, attn: _FluxAttention) -> torch.Tensor:
    return x.unflatten(-1, (-1, attn.head_dim))


def _attention(attn: _FluxAttention, q, k, v):
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    proc = attn.processor
    with kernel_breaks(attn):
        out = dispatch_attention_fn(q, k, v, attn_mask=None, backend=proc._attention_backend,
                                    parallel_config=proc._parallel_config)
    return out.flatten(2, 3).to(q.dtype)


def _joint_attention(call: Callable, attn: _FluxAttention, hidden, context, rotary, contiguous: bool, qkv: Callable):
    """FluxAttnProcessor with encoder_hidden_states, op for op, its q/k norms, RoPE and
    concatenation fused (ops_rope.QK_PAIRS)."""
    query, key, value, eq, ek, ev = qkv(attn, hidden, context)
    query, key, value, eq, ek, ev = (_heads(t, attn) for t in (query, key, value, eq, ek, ev))
    if rotary is not None:
        qk = chain(call, QK_PAIRS)
        query = qk((eq, query), (attn.norm_added_q, attn.norm_q), rotary)
        key = qk((ek, key), (attn.norm_added_k, attn.norm_k), rotary)
    else:
        query = torch.cat([attn.norm_added_q(eq), attn.norm_q(query)], dim=1)
        key = torch.cat([attn.norm_added_k(ek), attn.norm_k(key)], dim=1)
    value = torch.cat([ev, value], dim=1)
    out = _attention(attn, query, key, value)
    enc, img = out.split_with_sizes([context.shape[1], out.shape[1] - context.shape[1]], dim=1)
    img = attn.to_out[1](attn.to_out[0](img.contiguous() if contiguous else img))
    enc = attn.to_add_out(enc.contiguous() if contiguous else enc)
    return img, enc


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    silu = _silu(fx)
    prefix = _prefix(block)
    qkv = _module(prefix)._get_qkv_projections
    contiguous = prefix == "Flux"
    class_forward = type(block).forward
    attn = block.attn

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        if joint_attention_kwargs or not inlinable(attn):
            return class_forward(block, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                 joint_attention_kwargs)
        e = silu(temb)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.norm1.linear(e).chunk(6, dim=1)
        c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = \
            block.norm1_context.linear(e).chunk(6, dim=1)
        norm_h = ln_adaln(call, hidden_states, block.norm1.norm, scale_msa[:, None], shift_msa[:, None])
        norm_c = ln_adaln(call, encoder_hidden_states, block.norm1_context.norm, c_scale_msa[:, None],
                          c_shift_msa[:, None])

        attn_output, context_attn_output = _joint_attention(call, attn, norm_h, norm_c, image_rotary_emb,
                                                            contiguous, qkv)

        # the residual, norm2 and its modulation: one kernel; then the feed-forward and its residual
        hidden_states, norm_h = gated_res_ln_adaln(call, attn_output, gate_msa.unsqueeze(1), hidden_states,
                                                   block.norm2, scale_mlp[:, None], shift_mlp[:, None])
        hidden_states = call(GATED_RESIDUAL, hidden_states, gate_mlp.unsqueeze(1), block.ff(norm_h))

        encoder_hidden_states, norm_c = gated_res_ln_adaln(
            call, context_attn_output, c_gate_msa.unsqueeze(1), encoder_hidden_states, block.norm2_context,
            c_scale_mlp[:, None], c_shift_mlp[:, None])
        encoder_hidden_states = call(GATED_RESIDUAL, encoder_hidden_states, c_gate_mlp.unsqueeze(1),
                                     block.ff_context(norm_c))
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return guarded(f"{prefix.lower()}_block", block, forward, fx)


def _joined(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """torch.cat([first, second], dim=1), without the copy when they are the two halves of one
    contiguous tensor (the previous single-stream block's output, sliced at the text length)."""
    base = first._base
    if (base is not None and second._base is base and base.is_contiguous() and base.dim() == 3
            and first.shape[0] == second.shape[0] == base.shape[0] and first.shape[2] == base.shape[2]
            and first.shape[1] + second.shape[1] == base.shape[1] and first.data_ptr() == base.data_ptr()
            and second.data_ptr() == base.data_ptr() + first.shape[1] * base.stride(1) * base.element_size()
            and first.stride() == second.stride() == base.stride()):
        return base
    return torch.cat([first, second], dim=1)


def single_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    silu = _silu(fx)
    prefix = _prefix(block)
    qkv = _module(prefix)._get_qkv_projections
    class_forward = type(block).forward
    attn = block.attn
    gelu_cat = chain(call, GELU_CAT)

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        if joint_attention_kwargs or not inlinable(attn):
            return class_forward(block, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                 joint_attention_kwargs)
        text_seq_len = encoder_hidden_states.shape[1]
        hidden_states = _joined(encoder_hidden_states, hidden_states)
        residual = hidden_states
        shift_msa, scale_msa, gate = block.norm.linear(silu(temb)).chunk(3, dim=1)
        norm_h = ln_adaln(call, hidden_states, block.norm.norm, scale_msa[:, None], shift_msa[:, None])
        mlp = block.proj_mlp(norm_h)  # its GELU joins the concatenation below

        # FluxAttnProcessor without encoder_hidden_states, op for op, q/k norm + RoPE fused
        query, key, value, *_ = qkv(attn, norm_h, None)
        query, key, value = (_heads(t, attn) for t in (query, key, value))
        if image_rotary_emb is not None:
            qk = chain(call, QK_PAIRS)
            query = qk((query,), (attn.norm_q,), image_rotary_emb)
            key = qk((key,), (attn.norm_k,), image_rotary_emb)
        else:
            query, key = attn.norm_q(query), attn.norm_k(key)
        attn_output = _attention(attn, query, key, value)

        hidden_states = gelu_cat(attn_output, mlp, block.act_mlp)
        hidden_states = call(GATED_RESIDUAL, residual, gate.unsqueeze(1), block.proj_out(hidden_states))
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]

    return guarded(f"{prefix.lower()}_single_block", block, forward, fx)


OPS = ("adaln", "ln_adaln", "gated_res_ln_adaln", "gated_residual", *(op.name for op in QK_PAIRS),
       *(op.name for op in GELU_CAT))
