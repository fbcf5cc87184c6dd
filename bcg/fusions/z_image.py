"""Z-Image: `ZImageTransformerBlock.forward` with its elementwise chains fused (diffusers 0.42 source).

Each block runs six RMSNorms (attention_norm1/2, ffn_norm1/2 over the model width, norm_q/norm_k
over the head dim), each eager as ~7 kernels (`.float()`, `pow`, `mean`, `+ eps`, `rsqrt`, `*`,
`.to()`, `* weight`) around one reduction, plus RoPE (4 kernels a tensor), the modulation and gated
residuals and SwiGLU. The fused forward keeps every GEMM and the attention kernel aten's, computes
each variance in aten's own reduction order, and runs one kernel for each chain (the shared kernels_rms.py,
kernels_rope.py, kernels_act.py);
every chain is verified against eager on first sight, the variance against aten's mean:

    each RMSNorm's variance                  1 kernel in aten's reduction order (rms_variance_*;
                                             last resort: our squares + aten's mean, 2 kernels)
    attention_norm1(x) * scale_msa           1 kernel
    norm_q / norm_k + RoPE                   1 kernel each, the variance reduced in it (else its own
                                             kernel first); the complex product's FMA contraction
                                             picked by the verifier
    x + gate_msa * attention_norm2(attn)     1 kernel
    ffn_norm1(x) * scale_mlp                 1 kernel
    silu(w1 h) * w3 h                        1 kernel (w1, w3, w2 stay the module's linears)
    x + gate_mlp * ffn_norm2(ff)             1 kernel

The modulation linear, tanh and `1 + scale` (a few thousand elements) stay eager, as do the refiner
blocks' calls with a per-token noise mask (the omni variant): those run the class's forward.
Installation sets an instance `forward` on each block; removal deletes it. Model code is not edited.
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .ops_act import SWIGLU
from .ops_rms import NORM_ROPE, NORM_ROPE_IN, RMS_RESIDUAL, RMS_SCALE, RMS_VARIANCE
from .protocols import Attention
from .verify import Verifier, chain


class _FeedForward(Protocol):
    w1: nn.Module
    w2: nn.Module
    w3: nn.Module


class _Block(Protocol):
    """ZImageTransformerBlock (the rule matches its class name) as its fused forward reads it;
    check_block pins the processor, the feed-forward's class and the four RMSNorms."""

    modulation: bool
    adaLN_modulation: nn.Module
    attention: Attention
    feed_forward: _FeedForward
    attention_norm1: nn.Module
    attention_norm2: nn.Module
    ffn_norm1: nn.Module
    ffn_norm2: nn.Module


def check_block(block: nn.Module) -> str | None:
    """Why this block's forward cannot be swapped (None: it can)."""
    try:
        from diffusers.models.normalization import RMSNorm
        from diffusers.models.transformers.transformer_z_image import FeedForward, ZSingleStreamAttnProcessor
    except ImportError as exc:
        return f"diffusers lacks the Z-Image classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    attn, ff = getattr(block, "attention", None), getattr(block, "feed_forward", None)
    if attn is None or type(attn.processor) is not ZSingleStreamAttnProcessor:
        return "attention does not use ZSingleStreamAttnProcessor"
    if type(ff) is not FeedForward or "forward" in ff.__dict__ or "_forward_silu_gating" in ff.__dict__:
        return "feed_forward is not diffusers' plain FeedForward"
    for name in ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"):
        norm = getattr(block, name, None)
        if type(norm) is not RMSNorm or norm.weight is None or norm.bias is not None:
            return f"{name} is not an RMSNorm with a weight and no bias"
        if "forward" in norm.__dict__ or getattr(norm, "_diffusers_hook", None) is not None:
            return f"{name} carries a hook or an instance forward (layerwise casting, offloading)"
    return None


def _attention(attn: Attention, hidden_states, attention_mask, freqs_cis, norm_rope: Callable):
    """ZSingleStreamAttnProcessor, op for op, with norm + RoPE of q and k fused."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor

    query = attn.to_q(hidden_states)
    key = attn.to_k(hidden_states)
    value = attn.to_v(hidden_states)
    query = query.unflatten(-1, (attn.heads, -1))
    key = key.unflatten(-1, (attn.heads, -1))
    value = value.unflatten(-1, (attn.heads, -1))
    if freqs_cis is not None and attn.norm_q is not None and attn.norm_k is not None:
        query = norm_rope(query, attn.norm_q, attn.norm_q.eps, freqs_cis)
        key = norm_rope(key, attn.norm_k, attn.norm_k.eps, freqs_cis)
    else:  # the processor's own ops (no q/k norm, or no RoPE)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if freqs_cis is not None:
            query = _rope(query, freqs_cis)
            key = _rope(key, freqs_cis)
    dtype = query.dtype
    query, key = query.to(dtype), key.to(dtype)
    if attention_mask is not None and attention_mask.ndim == 2:
        attention_mask = attention_mask[:, None, None, :]
    proc = attn.processor
    with kernel_breaks(attn):  # bcg's attention break
        hidden_states = dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=getattr(proc, "_attention_backend", ZSingleStreamAttnProcessor._attention_backend),
            parallel_config=getattr(proc, "_parallel_config", ZSingleStreamAttnProcessor._parallel_config),
        )
    hidden_states = hidden_states.flatten(2, 3)
    hidden_states = hidden_states.to(dtype)
    output = attn.to_out[0](hidden_states)
    if len(attn.to_out) > 1:  # dropout
        output = attn.to_out[1](output)
    return output


def _rope(x_in: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    with torch.amp.autocast("cuda", enabled=False):
        x = torch.view_as_complex(x_in.float().reshape(*x_in.shape[:-1], -1, 2))
        x_out = torch.view_as_real(x * freqs_cis.unsqueeze(2)).flatten(3)
        return x_out.type_as(x_in)


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    z = cast(_Block, block)  # the children check_block pinned (nn.Module types them Tensor | Module)
    attn, ff = z.attention, z.feed_forward
    n1, n2, f1, f2 = z.attention_norm1, z.attention_norm2, z.ffn_norm1, z.ffn_norm2
    variance = chain(call, RMS_VARIANCE)
    with_variance = chain(call, NORM_ROPE)
    # the variance in the RoPE kernel first; else its own kernel (or aten's mean) and the chains above
    norm_rope = chain(call, NORM_ROPE_IN, last=lambda x, norm, eps, f: with_variance(x, variance(x), norm, eps, f))
    class_forward = type(block).forward

    def forward(
        x: torch.Tensor,
        attn_mask: torch.Tensor,
        freqs_cis: torch.Tensor,
        adaln_input: torch.Tensor | None = None,
        noise_mask: torch.Tensor | None = None,
        adaln_noisy: torch.Tensor | None = None,
        adaln_clean: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if noise_mask is not None or (z.modulation and adaln_input is None):
            # per-token modulation (omni): the class's forward, unfused
            return class_forward(block, x, attn_mask, freqs_cis, adaln_input, noise_mask, adaln_noisy, adaln_clean)
        scale_msa = gate_msa = scale_mlp = gate_mlp = None
        if z.modulation:
            mod = z.adaLN_modulation(adaln_input)
            scale_msa, gate_msa, scale_mlp, gate_mlp = mod.unsqueeze(1).chunk(4, dim=2)
            gate_msa, gate_mlp = gate_msa.tanh(), gate_mlp.tanh()
            scale_msa, scale_mlp = 1.0 + scale_msa, 1.0 + scale_mlp

        # Attention block
        h = call(RMS_SCALE, x, variance(x), n1, n1.eps, scale_msa)
        if inlinable(attn):
            attn_out = _attention(attn, h, attn_mask, freqs_cis, norm_rope)
        else:
            attn_out = attn(h, attention_mask=attn_mask, freqs_cis=freqs_cis)
        x = call(RMS_RESIDUAL, x, gate_msa, attn_out, variance(attn_out), n2, n2.eps)

        # FFN block (FeedForward inlined: its linears are the module's)
        h = call(RMS_SCALE, x, variance(x), f1, f1.eps, scale_mlp)
        y = ff.w2(call(SWIGLU, ff.w1(h), ff.w3(h)))
        return call(RMS_RESIDUAL, x, gate_mlp, y, variance(y), f2, f2.eps)

    return guarded("z_image_block", block, forward, fx)
