"""Qwen-Image: `QwenImageTransformerBlock.forward` with its elementwise chains fused (diffusers 0.42
source: QwenImageTransformerBlock, QwenDoubleStreamAttnProcessor2_0).

Per block (two streams, image and text, each with its own modulation, norms and feed-forward), eager
runs ~60 elementwise and copy kernels around its 14 GEMMs and one attention; the fused forward ~14:

    img_mod / txt_mod       SiLU(temb)                                  once a forward (not 2 a block)
    norm1 + modulate        LN(x) * (1 + scale) + shift                 4 -> 1 each stream
    q / k                   diffusers RMSNorm per head (the variance    ~14 -> 2 each (one kernel a
                            in aten's mean order), complex RoPE per     stream, into its slice of the
                            stream, cat [text, image]                   joint q / k)
    residual + norm2        x + gate * attn; LN + modulate              6 -> 1 each stream
    residual                x + gate * mlp                              2 -> 1 each stream

GEMMs, the attention kernel (with its joint text mask, built as the processor builds it) and the
feed-forwards stay aten's. Calls with `modulate_index` (zero_cond_t: per-token modulation) or
joint_attention_kwargs run the class's forward. Double-stream: the text tokens change every step,
so there is no prompt memo here (unlike SANA's, Wan's).
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .modulation import SameInput
from .ops import GATED_RESIDUAL
from .ops_norm import gated_res_ln_adaln, ln_adaln
from .ops_rope import QK_COMPLEX
from .protocols import Attention
from .verify import Verifier, chain


class _QwenAttention(Attention, Protocol):
    """The joint attention as QwenDoubleStreamAttnProcessor2_0 reads it: the image stream's
    projections and norms (Attention's) and the text stream's."""

    inner_dim: int
    add_q_proj: nn.Module
    add_k_proj: nn.Module
    add_v_proj: nn.Module
    norm_added_q: nn.Module | None
    norm_added_k: nn.Module | None
    to_add_out: nn.Module


def _plain_ln(norm: nn.Module) -> bool:
    return isinstance(norm, nn.LayerNorm) and norm.weight is None and norm.bias is None


def check_block(block: nn.Module) -> str | None:
    try:
        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0
    except ImportError as exc:
        return f"diffusers lacks the Qwen-Image classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    if type(cast(Attention, block.attn).processor) is not QwenDoubleStreamAttnProcessor2_0:
        return "attn does not use QwenDoubleStreamAttnProcessor2_0"
    for name in ("img_mod", "txt_mod"):
        mod = getattr(block, name)
        if not (isinstance(mod, nn.Sequential) and len(mod) == 2 and type(mod[0]) is nn.SiLU
                and isinstance(mod[1], nn.Linear) and "forward" not in mod.__dict__):
            return f"{name} is not Sequential(SiLU, Linear)"
    if not all(_plain_ln(getattr(block, n)) for n in ("img_norm1", "img_norm2", "txt_norm1", "txt_norm2")):
        return "its norms are not affine-free LayerNorms"
    return None


def _joint_attention(call: Callable, attn: _QwenAttention, hidden, context, context_mask, rotary):
    """QwenDoubleStreamAttnProcessor2_0, op for op, with the q/k norms, RoPE and concatenation fused."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    attention_mask = None
    if context_mask is not None:
        image_mask = torch.ones((hidden.shape[0], hidden.shape[1]), dtype=torch.bool, device=hidden.device)
        attention_mask = torch.cat([context_mask, image_mask], dim=1)[:, None, None, :]
    seq_txt = context.shape[1]
    head_dim = attn.inner_dim // attn.heads
    img_q, img_k, img_v = (t.unflatten(-1, (-1, head_dim)) for t in (attn.to_q(hidden), attn.to_k(hidden),
                                                                     attn.to_v(hidden)))
    txt_q, txt_k, txt_v = (t.unflatten(-1, (-1, head_dim)) for t in (attn.add_q_proj(context),
                                                                     attn.add_k_proj(context),
                                                                     attn.add_v_proj(context)))
    norms = (attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k)
    if rotary is not None and all(n is not None for n in norms):
        img_freqs, txt_freqs = rotary
        qk = chain(call, QK_COMPLEX)
        joint_q = qk((txt_q, img_q), (attn.norm_added_q, attn.norm_q), (txt_freqs, img_freqs))
        joint_k = qk((txt_k, img_k), (attn.norm_added_k, attn.norm_k), (txt_freqs, img_freqs))
    else:  # the processor's own ops
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        img_q, img_k = (n(t) if n is not None else t for n, t in ((attn.norm_q, img_q), (attn.norm_k, img_k)))
        txt_q, txt_k = (n(t) if n is not None else t for n, t in ((attn.norm_added_q, txt_q),
                                                                   (attn.norm_added_k, txt_k)))
        if rotary is not None:
            img_freqs, txt_freqs = rotary
            img_q, img_k = (apply_rotary_emb_qwen(t, img_freqs, use_real=False) for t in (img_q, img_k))
            txt_q, txt_k = (apply_rotary_emb_qwen(t, txt_freqs, use_real=False) for t in (txt_q, txt_k))
        joint_q, joint_k = torch.cat([txt_q, img_q], dim=1), torch.cat([txt_k, img_k], dim=1)
    joint_v = torch.cat([txt_v, img_v], dim=1)
    proc = attn.processor
    with kernel_breaks(attn):
        joint = dispatch_attention_fn(joint_q, joint_k, joint_v, attn_mask=attention_mask, dropout_p=0.0,
                                      is_causal=False, backend=proc._attention_backend,
                                      parallel_config=proc._parallel_config)
    joint = joint.flatten(2, 3).to(joint_q.dtype)
    img_out = attn.to_out[0](joint[:, seq_txt:, :].contiguous())
    if len(attn.to_out) > 1:
        img_out = attn.to_out[1](img_out)
    return img_out, attn.to_add_out(joint[:, :seq_txt, :].contiguous())


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    silu = fx.shared.setdefault("qwen_silu", SameInput(F.silu))  # the same temb for every block
    class_forward = type(block).forward
    attn = block.attn

    def forward(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb, image_rotary_emb=None,
                joint_attention_kwargs=None, modulate_index=None):
        if modulate_index is not None or block.zero_cond_t or joint_attention_kwargs or not inlinable(attn):
            return class_forward(block, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb,
                                 image_rotary_emb, joint_attention_kwargs, modulate_index)
        e = silu(temb)
        img_mod1, img_mod2 = block.img_mod[1](e).chunk(2, dim=-1)
        txt_mod1, txt_mod2 = block.txt_mod[1](e).chunk(2, dim=-1)
        # _modulate: shift, scale, gate = mod.chunk(3, dim=-1), each unsqueezed to [B, 1, D]
        img_shift1, img_scale1, img_gate1 = (t.unsqueeze(1) for t in img_mod1.chunk(3, dim=-1))
        txt_shift1, txt_scale1, txt_gate1 = (t.unsqueeze(1) for t in txt_mod1.chunk(3, dim=-1))
        img_modulated = ln_adaln(call, hidden_states, block.img_norm1, img_scale1, img_shift1)
        txt_modulated = ln_adaln(call, encoder_hidden_states, block.txt_norm1, txt_scale1, txt_shift1)

        img_attn_output, txt_attn_output = _joint_attention(call, attn, img_modulated, txt_modulated,
                                                            encoder_hidden_states_mask, image_rotary_emb)

        img_shift2, img_scale2, img_gate2 = (t.unsqueeze(1) for t in img_mod2.chunk(3, dim=-1))
        hidden_states, img_modulated2 = gated_res_ln_adaln(call, img_attn_output, img_gate1, hidden_states,
                                                           block.img_norm2, img_scale2, img_shift2)
        hidden_states = call(GATED_RESIDUAL, hidden_states, img_gate2, block.img_mlp(img_modulated2))

        txt_shift2, txt_scale2, txt_gate2 = (t.unsqueeze(1) for t in txt_mod2.chunk(3, dim=-1))
        encoder_hidden_states, txt_modulated2 = gated_res_ln_adaln(call, txt_attn_output, txt_gate1,
                                                                   encoder_hidden_states, block.txt_norm2,
                                                                   txt_scale2, txt_shift2)
        encoder_hidden_states = call(GATED_RESIDUAL, encoder_hidden_states, txt_gate2, block.txt_mlp(txt_modulated2))
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return guarded("qwen_image_block", block, forward, fx)


OPS = ("ln_adaln", "gated_res_ln_adaln", "gated_residual", *(op.name for op in QK_COMPLEX))
