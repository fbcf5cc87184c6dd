"""SANA: `SanaTransformerBlock.forward` with its elementwise chains fused (diffusers 0.42 source).

Per block, eager runs ~50 kernels (about 26 elementwise, 9 copies); the fused forward ~23
(SANA-1.6B: 1,010 kernels a step -> 478 on the H200, 427 with the prompt memo below; Inductor 492),
its chains verified one by one:

    modulation        table + timestep embedding       1 kernel a block -> 2 a forward (stack + add)
    adaLN x2          LN(x) * (1 + scale) + shift      3 kernels -> 1 (LayerNorm in aten's order,
                      kernels_norm.py; the cross-attention residual joins norm2's kernel)
    linear attention  relu, .float(), pad, two reshape copies; divide, cast   ~9 -> 2; or the whole
                      attention, its two fp32 products too, in 2 (kernels_linear.py), where that
                      equals cuBLAS's products
    residual 1        to_out bias, gate *, +            3 -> 1 (to_out's matmul stays aten)
    cross-attention   the mask prepared once a forward (not once a block); `/ 1.0` dropped
    GLUMBConv         conv bias + SiLU; conv bias + chunk + x * silu(gate)   5 -> 2; or, after the
                      1x1 conv, bias + SiLU + depthwise conv + bias + GLU in one kernel
    residual 2        gate *, +                        2 -> 1, joined by the next block's norm1 + adaLN

Everything else (projections, convs, SDPA) is the module's own call and bcg's attention breaks stay
where they were, so the forward is the block's source with chains swapped for `fx.call`.
Installation sets an instance `forward` on each block; removal deletes it. Model code is not edited.
The blocks of one installation share small caches (`Verifier.shared`): the cross-attention mask,
the forward's modulations, the norm one block hands the next, and the prompt state (the caption
path and every block's cross-attention K/V, made once per prompt batch under a graph:
sana_prompt.py, installed on the model by the `sana_prompt` rule).
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..memo import version as _version  # None for inference tensors (the job's torch.inference_mode)
from .guard import guarded
from .inline import inlinable, kernel_breaks
from .modulation import TableStack
from .ops import (
    CONV_BIAS_GLU,
    CONV_BIAS_SILU,
    DWCONV_GLU_COLS,
    DWCONV_GLU_ROWS,
    GATED_RESIDUAL,
    GATED_RESIDUAL_LINEAR,
    GLU,
    LINEAR_ATTENTION,
    LINEAR_ATTENTION_FMA,
    MODULATION,
    RESCALE_RESIDUAL,
    SILU_DWCONV_GLU,
)
from .ops_norm import gated_res_ln_adaln, ln_adaln, res_ln_adaln
from .protocols import Attention, GLUMBConv
from .sana_prompt import PromptState, caption_forwards, check_model
from .verify import Verifier, chain

# The one-pass depthwise conv + bias + GLU kernel (ops.DWCONV_GLU_ROWS, kernels.dwconv_glu_rows) is
# bit-exact with cuDNN's conv + the bias/GLU kernel on the H200 in bf16 and fp16 (cuDNN sums the 9 taps
# row-major; the verifier checks it on first sight of each key). It walks rows, reading each input
# row once. Until session 40 it lost where the job runs (499 vs 455 us at 1024², batch 8): latency-bound,
# each row step waited for its own loads and reloaded its 18 taps. With the taps hoisted out of the
# walk and the next row's loads issued before this row's arithmetic (session 41), it is the faster at
# every shape of the H200 sweep, CUDA-graph replays, bits equal in all 36 tiles: 388 vs 454 us at
# 1024², batch 8 (16 CFG rows of 32x32 pixels), 205 vs 231 at batch 4, 58 vs 84 at batch 1, 58 vs 66 at
# 512², batch 4, 17 vs 23 at batch 1 (benchmarks/results/fusion_kernels_dw_rows_silu_dw_h200.md). It
# runs for calls of at most this many pixels (batch x height x width): the largest measured, 1024²
# at batch 8; calls of more pixels (bigger batches, 2048² past batch 2) keep cuDNN's pair until they
# are measured. Other grids within the bound (2048² at batch 1, non-square) run it unmeasured.
ONE_PASS_DWCONV_MAX_PIXELS = 16 * 32 * 32

# The one-pass bias + SiLU + depthwise conv + bias + GLU from the raw 1x1 conv output
# (ops.SILU_DWCONV_GLU) is bit-exact on the H200 (18 of 18 tiles at both shapes) but slower than
# the two chains above: with the 1x1 conv, 86 vs 67 us a block at 16x16 pixels and 346 vs 247 us
# at 32x32 (best tiles; same file). It saves the activation's write and read, but applying bias +
# SiLU per loaded tap row and shifting columns costs more than the memory it saves. It runs for
# calls in this pixel range (inclusive): none by default; the verifier still guards it if enabled.
SILU_DWCONV_PIXELS = (1, 0)


class _CrossAttention(Attention, Protocol):
    """attn2 as SanaAttnProcessor2_0 reads it."""

    rescale_output_factor: float

    def prepare_attention_mask(self, attention_mask: torch.Tensor, target_length: int,
                               batch_size: int) -> torch.Tensor: ...


class _Block(Protocol):
    """SanaTransformerBlock as its fused forward reads it: check_block pins attn1's processor and
    the feed-forward's class; the forward checks attn2's processor."""

    norm1: nn.Module
    norm2: nn.Module
    attn1: Attention
    attn2: _CrossAttention | None
    ff: GLUMBConv


def check_block(block: nn.Module) -> str | None:
    """Why this block's forward cannot be swapped (None: it can)."""
    try:
        from diffusers.models.attention_processor import SanaLinearAttnProcessor2_0
        from diffusers.models.transformers.sana_transformer import GLUMBConv
    except ImportError as exc:
        return f"diffusers lacks the Sana classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode (dropout)"
    attn1, ff = getattr(block, "attn1", None), getattr(block, "ff", None)
    if attn1 is None or type(attn1.processor) is not SanaLinearAttnProcessor2_0:
        return "attn1 does not use SanaLinearAttnProcessor2_0"
    if not isinstance(attn1.to_out[1], nn.Dropout):
        return "attn1.to_out[1] is not a Dropout"
    if type(ff) is not GLUMBConv or ff.norm_type is not None or ff.residual_connection:
        return "ff is not a plain GLUMBConv (norm_type None, no residual)"
    if type(ff.nonlinearity) is not nn.SiLU:
        return "GLUMBConv's nonlinearity is not nn.SiLU"
    for conv in (ff.conv_inverted, ff.conv_depth):
        if conv.bias is None or conv.padding_mode != "zeros":
            return "GLUMBConv convs without bias or with non-zero padding"
    return None


def check_prompt(model: nn.Module) -> str | None:
    """Why this model's caption path cannot make the prompt state (sana_prompt; None: it can)."""
    return check_model(model, check_block)


def prompt_forwards(model: nn.Module, fx: Verifier) -> dict[str, Callable]:
    """caption_projection / caption_norm forwards that make every fused block's K/V once per
    prompt batch under a graph (sana_prompt.py), each verified against the module's own forward."""
    made = caption_forwards(model, fx.shared.setdefault("sana_prompt", PromptState()), check_block)
    return {name: guarded("sana_prompt", model.get_submodule(name), fwd, fx) for name, fwd in made.items()}


class MaskCache:
    """Every block prepares the same cross-attention mask (same input tensor, same heads): the
    first block's result serves the rest of the forward. The entry holds the input tensor itself
    (so its id cannot be reused) and its version counter (an in-place change is a miss)."""

    def __init__(self) -> None:
        self.entry: tuple | None = None

    def get(self, attn: _CrossAttention, mask: torch.Tensor, target_length: int, batch_size: int) -> torch.Tensor:
        # Inference tensors (the job runs under torch.inference_mode) carry no version counter:
        # for them the key is the tensor's identity alone. diffusers builds the mask anew in every
        # transformer forward and never edits it in place, so identity is enough there.
        key = (attn.heads, target_length, batch_size, _version(mask))
        e = self.entry
        if e is not None and e[0] is mask and e[1] == key:
            return e[2]
        out = attn.prepare_attention_mask(mask, target_length, batch_size)
        self.entry = (mask, key, out)
        return out


class ModulationCache(TableStack):
    """Every block adds its own `scale_shift_table` to the same timestep embedding: a small add each
    (one launch of ~7 us a block at SANA-1.6B, 20 a forward). The first block of a forward makes all
    the fused blocks' modulations in one add (ops.MODULATION, verified like every chain) and the
    others take their slice (modulation.TableStack)."""

    def __init__(self) -> None:
        super().__init__(MODULATION, lambda table, t, batch_size: table[None] + t.reshape(batch_size, 6, -1))


class NormHandoff:
    """A block's last residual and the next block's norm1 + adaLN in one kernel (ops_norm.GRES_LN_ADALN;
    Inductor fuses the same pair across the block boundary): block i makes the next block's
    normalised input along with its own output and leaves it here. Block i + 1 takes it only if it
    is the block it was made for, called with that very output tensor (not edited since) and the
    same timestep embedding; otherwise it is dropped and the block normalises its input itself."""

    def __init__(self) -> None:
        self.entry: tuple | None = None

    def put(self, target: nn.Module, hidden: torch.Tensor, timestep: torch.Tensor, normed: torch.Tensor) -> None:
        self.entry = (target, hidden, _version(hidden), timestep, normed)

    def ready(self, block: nn.Module, hidden: torch.Tensor, timestep: torch.Tensor) -> bool:
        """Whether `take` would hand this block its normalised input (without taking it)."""
        e = self.entry
        return not (e is None or e[0] is not block or e[1] is not hidden or e[2] != _version(hidden)
                    or e[3] is not timestep)

    def take(self, block: nn.Module, hidden: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor | None:
        ready, e, self.entry = self.ready(block, hidden, timestep), self.entry, None
        if not ready:
            return None
        assert e is not None  # ready: there was an entry
        return e[4]


def _cross_attention(attn, hidden_states, encoder_hidden_states, attention_mask, masks: MaskCache,
                     prompt: PromptState):
    """SanaAttnProcessor2_0, op for op, up to `to_out` (the caller fuses `/ rescale_output_factor`
    with the residual), with the prepared mask shared across blocks and K/V from the prompt state
    (sana_prompt) where it made them."""
    batch_size, sequence_length, _ = (
        hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
    )
    if attention_mask is not None:
        attention_mask = masks.get(attn, attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
    query = attn.to_q(hidden_states)
    if encoder_hidden_states is None:
        encoder_hidden_states = hidden_states
    kv = prompt.take_kv(attn, encoder_hidden_states)
    if kv is None:
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
    else:
        key, value = kv
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)
    inner_dim = key.shape[-1]
    head_dim = inner_dim // attn.heads
    query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    with kernel_breaks(attn):  # bcg's attention break
        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False
        )
    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
    hidden_states = hidden_states.to(query.dtype)
    hidden_states = attn.to_out[0](hidden_states)
    return attn.to_out[1](hidden_states)


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    sana = cast(_Block, block)  # the children check_block pinned (nn.Module types them Tensor | Module)
    attn1, attn2, ff = sana.attn1, sana.attn2, sana.ff
    call = fx.call
    masks = fx.shared.setdefault("sana_masks", MaskCache())  # one per installation: all blocks
    modulation = fx.shared.setdefault("sana_modulation", ModulationCache())
    modulation.add(block)
    handoff = fx.shared.setdefault("sana_norm_handoff", NormHandoff())
    prompt = fx.shared.setdefault("sana_prompt", PromptState())
    linear_attention = chain(call, (LINEAR_ATTENTION_FMA, LINEAR_ATTENTION))
    SanaAttnProcessor2_0: type | None
    try:
        from diffusers.models.transformers.sana_transformer import SanaAttnProcessor2_0
    except ImportError:  # pragma: no cover - check_block refused such a diffusers already
        SanaAttnProcessor2_0 = None

    def residual_linear(h, g, x, linear):  # fallback: the module's linear, then the fused gate
        return call(GATED_RESIDUAL, h, g, linear(x))

    def glu_fallback(x, conv):
        return call(GLU, conv(x))

    def conv_glu(x, conv):  # cuDNN's conv, then the fused bias + GLU
        return call(CONV_BIAS_GLU, x, conv, fallback=glu_fallback)

    def dwconv_glu(x, conv):
        if x.shape[0] * x.shape[2] * x.shape[3] > ONE_PASS_DWCONV_MAX_PIXELS:
            return conv_glu(x, conv)
        return call(DWCONV_GLU_ROWS, x, conv,
                    fallback=lambda x, c: call(DWCONV_GLU_COLS, x, c, fallback=conv_glu))

    def two_pass(x, conv_inv, conv_dw):  # the 1x1 conv + bias + SiLU, then the depthwise chain
        return dwconv_glu(call(CONV_BIAS_SILU, x, conv_inv), conv_dw)

    def glumbconv_in(x):  # GLUMBConv up to conv_point: x [B, D, h, w] -> [B, hidden, h, w]
        lo, hi = SILU_DWCONV_PIXELS
        if not lo <= x.shape[0] * x.shape[2] * x.shape[3] <= hi:
            return two_pass(x, ff.conv_inverted, ff.conv_depth)
        return call(SILU_DWCONV_GLU, x, ff.conv_inverted, ff.conv_depth, fallback=two_pass)

    def forward(
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        timestep: torch.LongTensor | None = None,
        height: int | None = None,
        width: int | None = None,
    ) -> torch.Tensor:
        batch_size = hidden_states.shape[0]

        # 1. Modulation
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation.get(
            call, block, timestep, batch_size).chunk(6, dim=1)

        # 2. Self attention (SanaLinearAttnProcessor2_0 inlined); norm1 made by the previous block's
        # last kernel where it could
        norm_hidden_states = handoff.take(block, hidden_states, timestep)
        if norm_hidden_states is None:
            norm_hidden_states = ln_adaln(call, hidden_states, sana.norm1, scale_msa, shift_msa)
        norm_hidden_states = norm_hidden_states.to(hidden_states.dtype)
        if inlinable(attn1):
            query = attn1.to_q(norm_hidden_states)
            key = attn1.to_k(norm_hidden_states)
            value = attn1.to_v(norm_hidden_states)
            if attn1.norm_q is not None:
                query = attn1.norm_q(query)
            if attn1.norm_k is not None:
                key = attn1.norm_k(key)
            attn_output = linear_attention(query, key, value, attn1.heads)
            if attn_output.dtype == torch.float16:  # the processor clips fp16 after to_out
                attn_output = attn1.to_out[1](attn1.to_out[0](attn_output)).clip(-65504, 65504)
                hidden_states = call(GATED_RESIDUAL, hidden_states, gate_msa, attn_output)
            else:  # to_out[1] is an eval Dropout: identity
                hidden_states = call(GATED_RESIDUAL_LINEAR, hidden_states, gate_msa, attn_output,
                                     attn1.to_out[0], fallback=residual_linear)
        else:
            attn_output = attn1(norm_hidden_states)
            hidden_states = call(GATED_RESIDUAL, hidden_states, gate_msa, attn_output)

        # 3. Cross attention (the module's own call: bcg's breaks live there)
        if attn2 is not None and type(attn2.processor) is SanaAttnProcessor2_0 and inlinable(attn2):
            attn_output = _cross_attention(attn2, hidden_states, encoder_hidden_states,
                                           encoder_attention_mask, masks, prompt)
            # the residual add, norm2 and its modulation: one kernel
            hidden_states, norm_hidden_states = res_ln_adaln(
                call, RESCALE_RESIDUAL, attn_output, attn2.rescale_output_factor, hidden_states,
                sana.norm2, scale_mlp, shift_mlp)
        else:
            if attn2 is not None:
                attn_output = attn2(
                    hidden_states,
                    encoder_hidden_states=encoder_hidden_states,
                    attention_mask=encoder_attention_mask,
                )
                hidden_states = attn_output + hidden_states
            norm_hidden_states = ln_adaln(call, hidden_states, sana.norm2, scale_mlp, shift_mlp)

        # 4. Feed-forward (GLUMBConv inlined)
        norm_hidden_states = norm_hidden_states.unflatten(1, (height, width)).permute(0, 3, 1, 2)
        x = glumbconv_in(norm_hidden_states)
        ff_output = ff.conv_point(x)
        ff_output = ff_output.flatten(2, 3).permute(0, 2, 1)
        following = modulation.following(block)
        if following is None:
            return call(GATED_RESIDUAL, hidden_states, gate_mlp, ff_output)
        # the residual, then the next block's norm1 + adaLN: one kernel (NormHandoff)
        shift_next, scale_next = modulation.get(call, following, timestep, batch_size).chunk(6, dim=1)[:2]
        hidden_states, normed = gated_res_ln_adaln(call, ff_output, gate_mlp, hidden_states, following.norm1,
                                                   scale_next, shift_next)
        handoff.put(following, hidden_states, timestep, normed)
        return hidden_states

    def variant(hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                timestep=None, height=None, width=None):
        # the paths that state outside the arguments opens: verified each on its own (guard.py)
        return (handoff.ready(block, hidden_states, timestep),
                attn2 is not None and prompt.has_kv(attn2, encoder_hidden_states))

    return guarded("sana_block", block, forward, fx, variant=variant)
