"""GLM-Image: `GlmImageTransformerBlock.forward` with its elementwise chains fused, and the final
`GlmImageAdaLayerNormContinuous` (diffusers 0.42 source: GlmImageTransformerBlock, GlmImageAttnProcessor,
GlmImageAdaLayerNormZero).

CogView4's block shape: two streams (text, image) in the model dtype, one modulation linear for both
(12 chunks), affine-free LayerNorms, joint attention over [text, image] with per-head LayerNorm q / k
norms and rotate-half RoPE on the image tokens, gated residuals, one GELU-tanh feed-forward run on
each stream. Per block, eager runs ~45 elementwise and copy kernels around its 10 GEMMs and one
attention; fused ~16 (~18 at batch > 1), each chain verified on first sight:

    chain                                    eager kernels -> fused                     where
    norm1 (each stream)  LN(x) * (1 + scale)  4 -> 1 each (kernels_norm)                 ln_adaln
                         + shift
    q / k  LayerNorm per head, then           ~11 -> 5 each (bf16; ~8 in fp32): aten's   qk_glm_split_plain
      apply_rotary_emb(use_real_unbind_dim=   LayerNorm, the image rows made contiguous
      -2) on the image slice, written back    (a view at batch 1), the rotation kernel
                                              (kernels_rope, split pairs) once a half,
                                              the first halves copied over the second's
    residual + norm2 (each stream)            5 -> 1 each (2: the attention output's     gated_res_ln_adaln
      h + y * gate; LN(h) * (1 + s) + t       slice made contiguous, at batch > 1)
    residual  h + ff * gate (each stream)     2 -> 1 each                                gated_residual
    norm_out  LN(x) * (1 + scale) + shift     4 -> 1 (once a forward)                    ln_adaln

The rotation kernel reads one cos / sin a rotate-half pair (j, j + D/2), where eager reads cos[j] for
element j and cos[j + D/2] for element j + D/2: one call with the tables' first halves gives the
first elements, one with their second halves the second elements, whatever the values (the model's
own tables repeat their halves; a graph replays whatever table it is handed, so nothing may rest on
that).

Left as the module's own calls: every GEMM (the Linear modules, the modulation linear included), the
concatenation of the streams, the q / k LayerNorms (aten's; no kernel of ours has its order), the
attention kernel (dispatch_attention_fn, with bcg's attention breaks kept; the text mask built as the
processor builds it), and the feed-forward whole. Calls the forward does not cover run the class's
forward: a KV cache (image-to-image), attention_kwargs, streams of different dtypes, rotary tables
that are not a (cos, sin) pair, and an attention module wrapped by something else than bcg's breaks.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, cast

import torch
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .ops import ADALN, GATED_RESIDUAL
from .ops_norm import GRES_LN_ADALN, LN_ADALN, gated_res_ln_adaln, ln_adaln
from .ops_rope import QK_GLM
from .protocols import Attention
from .verify import Verifier, chain


class _Norm1(Protocol):
    norm: nn.Module
    norm_context: nn.Module
    linear: nn.Module


class _Block(Protocol):
    """GlmImageTransformerBlock as the fused forward reads it (check_block pins its children)."""

    norm1: _Norm1
    attn1: Attention
    norm2: nn.Module
    norm2_context: nn.Module
    ff: nn.Module


def _plain_ln(norm: object) -> bool:
    return (isinstance(norm, nn.LayerNorm) and norm.weight is None and norm.bias is None
            and len(norm.normalized_shape) == 1 and "forward" not in norm.__dict__)


def check_block(block: nn.Module) -> str | None:
    try:
        from diffusers.models.transformers import transformer_glm_image as T
    except ImportError as exc:
        return f"diffusers lacks the GLM-Image classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    attn = getattr(block, "attn1", None)
    if attn is None or type(attn.processor) is not T.GlmImageAttnProcessor:
        return "attn1 does not use GlmImageAttnProcessor"
    if not (_plain_ln(attn.norm_q) and _plain_ln(attn.norm_k)):
        return "attn1's q / k norms are not affine-free LayerNorms"
    norm1 = getattr(block, "norm1", None)
    if type(norm1) is not T.GlmImageAdaLayerNormZero or "forward" in norm1.__dict__ \
            or not (_plain_ln(norm1.norm) and _plain_ln(norm1.norm_context)):
        return "norm1 is not a plain GlmImageAdaLayerNormZero over affine-free LayerNorms"
    if not (_plain_ln(getattr(block, "norm2", None)) and _plain_ln(getattr(block, "norm2_context", None))):
        return "norm2 / norm2_context are not affine-free LayerNorms"
    return None


def _text_mask(mask: torch.Tensor, batch: int, text: int, image: int, like: torch.Tensor) -> torch.Tensor:
    """GlmImageAttnProcessor's joint mask from the text mask, op for op."""
    assert mask.dim() == 2, "the shape of text_attn_mask should be (batch_size, text_seq_length)"
    text_attn_mask = mask.float().to(like.device)
    mix_attn_mask = torch.ones((batch, text + image), device=like.device)
    mix_attn_mask[:, :text] = text_attn_mask
    mix_attn_mask = mix_attn_mask.unsqueeze(2)
    attn_mask_matrix = mix_attn_mask @ mix_attn_mask.transpose(1, 2)
    return (attn_mask_matrix > 0).unsqueeze(1).to(like.dtype)


def _attention(qk: Callable, attn: Attention, hidden: torch.Tensor, context: torch.Tensor,
               mask: torch.Tensor | None, rotary: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
    """GlmImageAttnProcessor without a KV cache, op for op, its q / k norm + RoPE fused."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    batch, text, _ = context.shape
    image = hidden.shape[1]
    joint = torch.cat([context, hidden], dim=1)
    query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (attn.to_q(joint), attn.to_k(joint),
                                                                      attn.to_v(joint)))
    if rotary is not None:
        query = qk(query, attn.norm_q, text, rotary)
        key = qk(key, attn.norm_k, text, rotary)
    else:
        query, key = cast(nn.Module, attn.norm_q)(query), cast(nn.Module, attn.norm_k)(key)
    if mask is not None:
        mask = _text_mask(mask, batch, text, image, query)
    proc = attn.processor
    with kernel_breaks(attn):
        out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                    backend=proc._attention_backend, parallel_config=proc._parallel_config)
    out = out.flatten(2, 3).to(query.dtype)
    out = attn.to_out[1](attn.to_out[0](out))
    context_out, hidden_out = out.split([text, out.size(1) - text], dim=1)
    # each stream's rows contiguous (a copy at batch > 1, the same bits): the residual + norm2 kernel reads
    # contiguous rows; on the slices it would not apply, and eager's three kernels would run instead
    return hidden_out.contiguous(), context_out.contiguous()


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    b = cast(_Block, block)  # check_block pinned its children (nn.Module types them Tensor | Module)
    qk = chain(call, QK_GLM)
    class_forward = type(block).forward
    attn = b.attn1

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_mask):
        # 1. Timestep conditioning (GlmImageAdaLayerNormZero: its linear, then each stream's LN + adaLN)
        (shift_msa, c_shift_msa, scale_msa, c_scale_msa, gate_msa, c_gate_msa, shift_mlp, c_shift_mlp, scale_mlp,
         c_scale_mlp, gate_mlp, c_gate_mlp) = b.norm1.linear(temb).chunk(12, dim=1)
        norm_h = ln_adaln(call, hidden_states, b.norm1.norm, scale_msa.unsqueeze(1), shift_msa.unsqueeze(1))
        norm_c = ln_adaln(call, encoder_hidden_states, b.norm1.norm_context, c_scale_msa.unsqueeze(1),
                          c_shift_msa.unsqueeze(1))

        # 2. Joint attention
        attn_h, attn_c = _attention(qk, attn, norm_h, norm_c, attention_mask, image_rotary_emb)

        # 3. The residuals, norm2 and its modulation: one kernel a stream; the feed-forward and its residual
        hidden_states, norm_h = gated_res_ln_adaln(call, attn_h, gate_msa.unsqueeze(1), hidden_states, b.norm2,
                                                   scale_mlp.unsqueeze(1), shift_mlp.unsqueeze(1))
        encoder_hidden_states, norm_c = gated_res_ln_adaln(call, attn_c, c_gate_msa.unsqueeze(1),
                                                           encoder_hidden_states, b.norm2_context,
                                                           c_scale_mlp.unsqueeze(1), c_shift_mlp.unsqueeze(1))
        ff_output = b.ff(norm_h)
        ff_output_context = b.ff(norm_c)
        hidden_states = call(GATED_RESIDUAL, hidden_states, gate_mlp.unsqueeze(1), ff_output)
        encoder_hidden_states = call(GATED_RESIDUAL, encoder_hidden_states, c_gate_mlp.unsqueeze(1),
                                     ff_output_context)
        return hidden_states, encoder_hidden_states

    verified = guarded("glm_image_block", block, forward, fx)

    def route(hidden_states, encoder_hidden_states, temb=None, image_rotary_emb=None, attention_mask=None,
              attention_kwargs=None, kv_cache=None):
        """Calls the fused forward covers go to it (verified as a whole); the others to the class's forward,
        once (not through the guard, which would run it twice: a KV cache would store twice)."""
        rotary_ok = image_rotary_emb is None or (
            isinstance(image_rotary_emb, tuple) and len(image_rotary_emb) == 2
            and all(isinstance(t, torch.Tensor) for t in image_rotary_emb))
        if (attention_kwargs or kv_cache is not None or temb is None or not rotary_ok or not inlinable(attn)
                or encoder_hidden_states.dtype != hidden_states.dtype):
            return class_forward(block, hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_mask,
                                 attention_kwargs, kv_cache=kv_cache)
        return verified(hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_mask)

    route.__bcg_fusion__ = "glm_image_block"  # type: ignore[attr-defined]
    route.__wrapped__ = forward  # type: ignore[attr-defined]
    return route


def check_norm_out(norm: nn.Module) -> str | None:
    if "forward" in norm.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if not _plain_ln(getattr(norm, "norm", None)):
        return "its norm is not an affine-free LayerNorm"
    return None


def norm_out_forward(module: nn.Module, fx: Verifier) -> Callable:
    """GlmImageAdaLayerNormContinuous (no SiLU before its linear), its LN + modulation one kernel."""
    call = fx.call
    linear, norm = cast(Any, module).linear, cast(Any, module).norm

    def forward(x, conditioning_embedding):
        emb = linear(conditioning_embedding.to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return ln_adaln(call, x, norm, scale[:, None, :], shift[:, None, :])

    return guarded("glm_image_norm_out", module, forward, fx)


OPS = (LN_ADALN.name, ADALN.name, GRES_LN_ADALN.name, GATED_RESIDUAL.name, *(op.name for op in QK_GLM))
NORM_OUT_OPS = (LN_ADALN.name, ADALN.name)
