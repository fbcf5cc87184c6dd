"""SANA-Video: `SanaVideoTransformerBlock.forward` with SANA's chains bound at its shapes (diffusers 0.42
source: SanaVideoTransformerBlock, GLUMBTempConv).

    modulation        table + timestep embedding          every block's in one add a forward
    norm1 + adaLN     LN(x) * (1 + scale) + shift         3 -> 1 (kernels_norm, SANA's kernel)
    residual 1        x + gate * attn                     2 -> 1
    residual 2 + norm2 + adaLN   (attn2 + x), LN, adaLN   4 -> 1 (SANA's res_ln_adaln)
    GLUMBTempConv     conv bias + SiLU; conv bias + GLU   5 -> 2 (SANA's chains); the 1x1 and temporal
                                                          convs stay cuDNN's
    residual 3        x + gate * ff                       2 -> 1

Left as the module's own calls: the self-attention (SanaLinearAttnProcessor3_0: its RoPE and fp32
linear attention are another chain than SANA's, not fused yet), and the cross-attention whole (its
K/V are step-invariant: a prompt memo like SANA's would apply, not bound yet). Per-token modulation
(timestep [B, N, 6D]) makes the norm chains not applicable: eager runs them.
"""

from __future__ import annotations

from typing import Callable, Protocol

from torch import nn

from .guard import guarded
from .modulation import TableStack
from .ops import CONV_BIAS_GLU, CONV_BIAS_SILU, GATED_RESIDUAL, GLU, MODULATION_VIDEO, RESCALE_RESIDUAL
from .ops_norm import ln_adaln, res_ln_adaln
from .protocols import GLUMBConv
from .verify import Verifier


class _GLUMBTempConv(GLUMBConv, Protocol):
    """GLUMBConv and its temporal conv (check_block pins the class)."""

    conv_temp: nn.Conv2d


def check_block(block: nn.Module) -> str | None:
    try:
        from diffusers.models.transformers.transformer_sana_video import GLUMBTempConv
    except ImportError as exc:
        return f"diffusers lacks the SANA-Video classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    ff = getattr(block, "ff", None)
    if type(ff) is not GLUMBTempConv or ff.norm_type is not None or ff.residual_connection:
        return "ff is not a plain GLUMBTempConv (norm_type None, no residual)"
    if type(ff.nonlinearity) is not nn.SiLU or ff.conv_inverted.bias is None or ff.conv_depth.bias is None:
        return "GLUMBTempConv's nonlinearity is not SiLU, or a conv has no bias"
    if getattr(block, "attn2", None) is None or not isinstance(getattr(block, "norm2", None), nn.LayerNorm):
        return "no cross-attention (or norm2 is not a LayerNorm)"
    return None


def _glumb_temp_conv(call: Callable, ff: _GLUMBTempConv, x):
    """GLUMBTempConv.forward (no residual, no norm), op for op, its two bias chains fused."""
    batch_size, num_frames, height, width, num_channels = x.shape
    x = x.view(batch_size * num_frames, height, width, num_channels).permute(0, 3, 1, 2)
    x = call(CONV_BIAS_SILU, x, ff.conv_inverted)
    x = call(CONV_BIAS_GLU, x, ff.conv_depth, fallback=lambda x, conv: call(GLU, conv(x)))
    x = ff.conv_point(x)
    temporal = x.view(batch_size, num_frames, num_channels, height * width).permute(0, 2, 1, 3)
    x = temporal + ff.conv_temp(temporal)
    return x.permute(0, 2, 3, 1).view(batch_size, num_frames, height, width, num_channels)


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    stack = fx.shared.get("sana_video_modulation")
    if stack is None:
        stack = fx.shared["sana_video_modulation"] = TableStack(
            MODULATION_VIDEO, lambda table, t, batch: table[None, None] + t.reshape(batch, t.shape[1], 6, -1))
    stack.add(block)

    def forward(hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                timestep=None, frames=None, height=None, width=None, rotary_emb=None):
        batch_size = hidden_states.shape[0]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = stack.get(
            call, block, timestep, batch_size).unbind(dim=2)

        norm_hidden_states = ln_adaln(call, hidden_states, block.norm1, scale_msa, shift_msa)
        norm_hidden_states = norm_hidden_states.to(hidden_states.dtype)
        attn_output = block.attn1(norm_hidden_states, rotary_emb=rotary_emb)
        hidden_states = call(GATED_RESIDUAL, hidden_states, gate_msa, attn_output)

        attn_output = block.attn2(hidden_states, encoder_hidden_states=encoder_hidden_states,
                                  attention_mask=encoder_attention_mask)
        # attn_output + hidden_states (the processor divided by rescale_output_factor already), then
        # norm2 and its modulation: one kernel
        hidden_states, norm_hidden_states = res_ln_adaln(call, RESCALE_RESIDUAL, attn_output, 1.0, hidden_states,
                                                         block.norm2, scale_mlp, shift_mlp)

        norm_hidden_states = norm_hidden_states.unflatten(1, (frames, height, width))
        ff_output = _glumb_temp_conv(call, block.ff, norm_hidden_states).flatten(1, 3)
        return call(GATED_RESIDUAL, hidden_states, gate_mlp, ff_output)

    return guarded("sana_video_block", block, forward, fx)


OPS = ("modulation_video", "ln_adaln", "adaln", "gated_residual", "res_ln_adaln", "rescale_residual",
       "conv_bias_silu", "conv_bias_glu", "glu")
