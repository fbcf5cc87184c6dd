"""Wan 2.1 / 2.2: `WanTransformerBlock.forward` with its elementwise chains fused, and the text path's
cross-attention K/V made once per prompt batch (diffusers 0.42 source: WanTransformerBlock,
WanAttnProcessor, WanTimeTextImageEmbedding).

Wan keeps its residual stream in bf16 and its modulation in fp32: each chain below is one kernel
computing in fp32 with one rounding at the end, as eager's `(... .float() ...).type_as(x)` does.
Per block, eager runs ~45 elementwise and copy kernels around its 7 GEMMs and two attentions; fused:

    modulation       scale_shift_table + temb.float()       every block's in one add a forward
    norm1 + adaLN    FP32LayerNorm(x.float()) * (1 + s) + t  6 -> 1 (kernels_norm, fp32 plan)
    q / k            RMSNorm across heads, RoPE (the 3-D     ~10 -> 1 each (kernels_rope; aten's norm
                     frequencies, interleaved pairs)          + 1 kernel when the fused order differs)
    residual 1       (x.float() + attn * gate).type_as(x)    4 -> 1
    norm2            FP32LayerNorm with its affine           4 -> 1 (cross_attn_norm)
    cross K/V        to_k, norm_k, to_v of the text           once per prompt batch (wan_prompt memo)
    residual 2 + norm3 + adaLN                               7 -> 1
    residual 3       (x.float() + ff.float() * gate)         4 -> 1

GEMMs, the attention kernels and the feed-forward stay aten's. Blocks with per-token modulation
(Wan 2.2 TI2V, temb [B, S, 6, D]) or image context (I2V: add_k_proj) run the class's forward.
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .modulation import TableStack
from .ops import GATED_RESIDUAL_F32, MODULATION_F32
from .ops_norm import LN_ADALN_F32, LN_AFFINE_F32, RES_LN_ADALN_F32
from .ops_rope import QK_WAN
from .prompt import PromptState, projection_memo
from .protocols import Attention
from .verify import Verifier, chain


class _WanAttention(Attention, Protocol):
    """WanAttention as WanAttnProcessor reads it (its q/k RMSNorms are always there)."""

    norm_q: nn.Module
    norm_k: nn.Module
    fused_projections: bool
    to_kv: nn.Module
    add_k_proj: nn.Module | None


class _ConditionEmbedder(Protocol):
    text_embedder: nn.Module


class _WanModel(Protocol):
    """WanTransformer3DModel as the prompt memo reads it (check_model pins the text projection)."""

    condition_embedder: _ConditionEmbedder
    blocks: nn.ModuleList


def check_block(block: nn.Module) -> str | None:
    try:
        from diffusers.models.normalization import FP32LayerNorm
        from diffusers.models.transformers.transformer_wan import WanAttnProcessor
    except ImportError as exc:
        return f"diffusers lacks the Wan classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    for name in ("attn1", "attn2"):
        if type(getattr(block, name).processor) is not WanAttnProcessor:
            return f"{name} does not use WanAttnProcessor"
    if cast(_WanAttention, block.attn2).add_k_proj is not None:  # a WanAttention (its processor)
        return "attn2 has image context (I2V): its forward stays the class's"
    for name in ("norm1", "norm3"):
        norm = getattr(block, name)
        if type(norm) is not FP32LayerNorm or norm.weight is not None:
            return f"{name} is not an affine-free FP32LayerNorm"
    if not isinstance(block.norm2, (nn.Identity, FP32LayerNorm)):
        return "norm2 is neither Identity nor FP32LayerNorm"
    return None


def _heads(x: torch.Tensor, attn: _WanAttention) -> torch.Tensor:
    return x.unflatten(2, (attn.heads, -1))


def _attend(attn: _WanAttention, q, k, v, parallel: bool) -> torch.Tensor:
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    proc = attn.processor
    with kernel_breaks(attn):
        out = dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                    backend=proc._attention_backend,
                                    parallel_config=proc._parallel_config if parallel else None)
    out = out.flatten(2, 3).type_as(q)
    return attn.to_out[1](attn.to_out[0](out))


def _self_attention(call: Callable, attn: _WanAttention, hidden: torch.Tensor, rotary) -> torch.Tensor:
    """WanAttnProcessor without encoder_hidden_states, op for op, q/k norm + RoPE fused (QK_WAN)."""
    from diffusers.models.transformers.transformer_wan import _get_qkv_projections

    # diffusers annotates (attn: WanAttention, encoder_hidden_states: Tensor); it takes this view and None
    query, key, value = _get_qkv_projections(attn, hidden, None)  # type: ignore[arg-type]
    if rotary is not None:
        qk = chain(call, QK_WAN)
        query, key = qk(query, attn.norm_q, attn.heads, rotary), qk(key, attn.norm_k, attn.heads, rotary)
    else:
        query, key = _heads(attn.norm_q(query), attn), _heads(attn.norm_k(key), attn)
    return _attend(attn, query, key, _heads(value, attn), parallel=True)


def text_kv(attn: _WanAttention, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A cross-attention's K (normalised) and V of the text, as WanAttnProcessor makes them."""
    if attn.fused_projections:
        key, value = attn.to_kv(text).chunk(2, dim=-1)
    else:
        key, value = attn.to_k(text), attn.to_v(text)
    return attn.norm_k(key), value


def _cross_attention(attn: _WanAttention, hidden: torch.Tensor, text: torch.Tensor,
                     prompt: PromptState) -> torch.Tensor:
    query = attn.norm_q(attn.to_q(hidden))
    kv = prompt.take_kv(attn, text)
    key, value = text_kv(attn, text) if kv is None else kv
    return _attend(attn, _heads(query, attn), _heads(key, attn), _heads(value, attn), parallel=False)


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    stack = fx.shared.get("wan_modulation")
    if stack is None:
        stack = fx.shared["wan_modulation"] = TableStack(MODULATION_F32, lambda table, t: table + t.float())
    stack.add(block)
    prompt = fx.shared.setdefault("wan_prompt", PromptState())
    attn1, attn2 = block.attn1, block.attn2
    class_forward = type(block).forward
    affine_norm2 = not isinstance(block.norm2, nn.Identity)

    def forward(hidden_states, encoder_hidden_states, temb, rotary_emb):
        if temb.ndim != 3 or not (inlinable(attn1) and inlinable(attn2)):
            return class_forward(block, hidden_states, encoder_hidden_states, temb, rotary_emb)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
            stack.get(call, block, temb).chunk(6, dim=1))

        # 1. Self-attention
        norm_hidden_states = call(LN_ADALN_F32, hidden_states, block.norm1, scale_msa, shift_msa)
        attn_output = _self_attention(call, attn1, norm_hidden_states, rotary_emb)
        hidden_states = call(GATED_RESIDUAL_F32, hidden_states, gate_msa, attn_output)

        # 2. Cross-attention (its K/V from the prompt memo where it made them)
        if affine_norm2:
            norm_hidden_states = call(LN_AFFINE_F32, hidden_states, block.norm2)
        else:  # Identity: x.float().type_as(x) is x's values
            norm_hidden_states = hidden_states
        attn_output = _cross_attention(attn2, norm_hidden_states, encoder_hidden_states, prompt)

        # 3. The residual, norm3 and its modulation in one kernel; the feed-forward and its residual
        hidden_states, norm_hidden_states = call(RES_LN_ADALN_F32, attn_output, hidden_states, block.norm3,
                                                 c_scale_msa, c_shift_msa)
        return call(GATED_RESIDUAL_F32, hidden_states, c_gate_msa, block.ffn(norm_hidden_states))

    def variant(hidden_states, encoder_hidden_states, temb, rotary_emb):
        return prompt.has_kv(attn2, encoder_hidden_states)  # K/V from the memo: verified on their own

    return guarded("wan_block", block, forward, fx, variant=variant)


# -- the prompt memo: the text projection and every fused block's cross-attention K/V ----------------
def check_model(model: nn.Module) -> str | None:
    emb = getattr(model, "condition_embedder", None)
    proj = getattr(emb, "text_embedder", None)
    if type(proj).__name__ != "PixArtAlphaTextProjection":
        return "no PixArtAlphaTextProjection condition_embedder.text_embedder"
    if "forward" in proj.__dict__:
        return "its text_embedder already has an instance forward (another wrapper or hook)"
    if model.training:
        return "it is in training mode"
    if not any(check_block(b) is None for b in getattr(model, "blocks", [])):
        return "none of its blocks takes the fused forward"
    return None


def prompt_forwards(model: nn.Module, fx: Verifier) -> dict[str, Callable]:
    """An instance forward for `condition_embedder.text_embedder`: the projection P of the prompt
    embeddings and every fused block's attn2 K/V from P, in one memo break (bcg.memo); the blocks
    take their K/V when called with that very P."""
    wan = cast(_WanModel, model)  # check_model pinned these (nn.Module types them Tensor | Module)
    proj = wan.condition_embedder.text_embedder
    attns = [cast(_WanAttention, b.attn2) for b in wan.blocks if check_block(b) is None]
    state = fx.shared.setdefault("wan_prompt", PromptState())
    forward = projection_memo(proj, attns, state, text_kv)
    return {"condition_embedder.text_embedder": guarded("wan_prompt", proj, forward, fx)}


OPS = ("modulation_f32", "gated_residual_f32", *(op.name for op in QK_WAN), LN_ADALN_F32.name,
       RES_LN_ADALN_F32.name, LN_AFFINE_F32.name)
