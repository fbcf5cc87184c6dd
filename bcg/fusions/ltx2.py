"""LTX-2: `LTX2VideoTransformerBlock.forward` with its elementwise chains fused, both streams (video and
audio) and the audio <-> video cross-attentions (diffusers 0.42 source: LTX2VideoTransformerBlock,
LTX2AudioVideoAttnProcessor, LTX2Attention).

The block keeps both residual streams in the model dtype (bf16) and its modulation too: every chain
below is eager's ops rounded where eager stores (the shared bf16 plans). Its eight norms are diffusers
RMSNorms without a weight, its q/k norms torch.nn.RMSNorms across heads. Per block, eager runs ~160
elementwise and copy kernels (split RoPE, as released; ~180 interleaved) around its 28 GEMMs and six
attentions; fused ~40 (~48 where aten's q/k norm runs before the rotation), each chain verified:

    chain                                  eager kernels -> fused                         where
    modulation  table[None, None] +        6 a block -> 12 a forward (the six tables:     modulation_video
                temb.reshape(B, T, n, -1)  a stack and one add each, every block's)        (TableStack)
    norm1 / norm3 + adaLN (each stream)    ~10 -> 2: the variance in aten's mean order,   rms_variance_*,
      RMSNorm(x) * (1 + scale) + shift     then one kernel for the norm and its adaLN     rms_norm_adaln
    norm2 (each stream, no modulation)     7 -> 2                                         the same
    q / k (self, a2v, v2a; not the text    ~7 split, ~9 interleaved -> 1 each (aten's     qk_ltx_split_*,
      cross-attention, which has no RoPE)  fused-RMSNorm order) or 2 (aten's norm, then   qk_ltx_interleaved_*
      torch.nn.RMSNorm + RoPE, 8 a block   the rotation), as the attention's rope_type says
    audio_to_video / video_to_audio norms  ~26 -> 6: one variance each, four norm + adaLN  rms_norm_adaln
      and their four adaLNs                kernels (each norm feeds two modulations)
    gated residuals  x + y * gate (attn1,  2 -> 1 each, six a block (eight with LTX-2.3's   gated_residual
      a2v, v2a, feed-forward; each stream) text-query gates)
    LTX-2.3 (cross_attn_mod): the text     3 -> 1 each stream                             adaln
      K/V input's x * (1 + s) + t

Left as the module's own calls: every GEMM (the Linear modules), the attention kernels
(dispatch_attention_fn, with bcg's attention breaks kept), the text cross-attentions' q/k norms
(aten's fused RMSNorm, one kernel each, nothing around it to fuse), the text residual `x + attn`
(one add), the feed-forwards whole (GELU-tanh is one kernel between two GEMMs whose biases are in the
GEMM: no elementwise neighbour to merge with), and LTX-2.3's per-head attention gates
(`2 * sigmoid(logits)`, eager's three small kernels). Per-token modulation (a timestep a token) makes
the modulation chains not applicable (the kernels read a [B, 1, D] row): eager runs them.

The text stream's K/V (attn2, audio_attn2) are step-invariant in LTX-2.0: the prompt memo
(ltx2_prompt.py) makes them once per prompt batch. Calls this forward does not cover run the class's
forward: spatio-temporal guidance's perturbation (perturbation_mask or all_perturbed on a block with
perturbed_attn), and any attention whose forward is wrapped by something else than bcg's breaks.
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
from torch import nn

from .guard import guarded
from .inline import inlinable, kernel_breaks
from .modulation import TableStack
from .ops import ADALN, GATED_RESIDUAL, MODULATION_VIDEO
from .ops_rms import RMS_ADALN, RMS_VARIANCE, rms_adaln
from .ops_rope import QK_LTX, QK_LTX_SPLIT
from .prompt import PromptState
from .protocols import Attention
from .verify import Verifier, chain

ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
NORMS = ("norm1", "audio_norm1", "norm2", "audio_norm2", "audio_to_video_norm", "video_to_audio_norm", "norm3",
         "audio_norm3")


class LTXAttention(Attention, Protocol):
    """LTX2Attention as LTX2AudioVideoAttnProcessor reads it (its q/k norms are always there)."""

    norm_q: nn.Module
    norm_k: nn.Module
    rope_type: str
    to_gate_logits: nn.Module | None

    def prepare_attention_mask(self, attention_mask: torch.Tensor, target_length: int,
                               batch_size: int) -> torch.Tensor: ...


class _Block(Protocol):
    """LTX2VideoTransformerBlock as the fused forward reads it (check_block pins processors and norms)."""

    perturbed_attn: bool
    video_cross_attn_adaln: bool
    audio_cross_attn_adaln: bool
    cross_attn_adaln: bool
    scale_shift_table: torch.Tensor
    audio_scale_shift_table: torch.Tensor
    prompt_scale_shift_table: torch.Tensor
    audio_prompt_scale_shift_table: torch.Tensor
    video_a2v_cross_attn_scale_shift_table: torch.Tensor
    audio_a2v_cross_attn_scale_shift_table: torch.Tensor
    attn1: LTXAttention
    audio_attn1: LTXAttention
    attn2: LTXAttention
    audio_attn2: LTXAttention
    audio_to_video_attn: LTXAttention
    video_to_audio_attn: LTXAttention
    norm1: nn.Module
    audio_norm1: nn.Module
    norm2: nn.Module
    audio_norm2: nn.Module
    audio_to_video_norm: nn.Module
    video_to_audio_norm: nn.Module
    norm3: nn.Module
    audio_norm3: nn.Module
    ff: nn.Module
    audio_ff: nn.Module


def _tables() -> dict[str, Callable[[_Block], torch.Tensor]]:
    """The block's modulation tables, one TableStack each: get_mod_params(table, temb, B) adds one of
    them to one of the block's timestep embeddings."""
    return {
        "video": lambda b: b.scale_shift_table,
        "audio": lambda b: b.audio_scale_shift_table,
        "video_ca": lambda b: b.video_a2v_cross_attn_scale_shift_table[:4, :],
        "video_ca_gate": lambda b: b.video_a2v_cross_attn_scale_shift_table[4:, :],
        "audio_ca": lambda b: b.audio_a2v_cross_attn_scale_shift_table[:4, :],
        "audio_ca_gate": lambda b: b.audio_a2v_cross_attn_scale_shift_table[4:, :],
        "video_prompt": lambda b: b.prompt_scale_shift_table,  # LTX-2.3 (cross_attn_adaln) only
        "audio_prompt": lambda b: b.audio_prompt_scale_shift_table,
    }


def check_block(block: nn.Module) -> str | None:
    try:
        from diffusers.models.normalization import RMSNorm
        from diffusers.models.transformers import transformer_ltx2 as T
    except ImportError as exc:
        return f"diffusers lacks the LTX-2 classes ({exc})"
    if "forward" in block.__dict__:
        return "it already has an instance forward (another wrapper or hook)"
    if block.training:
        return "it is in training mode"
    for name in ATTENTIONS:
        attn = getattr(block, name, None)
        # the perturbed processor's unperturbed path is the plain one's ops (the forward routes
        # perturbed calls to the class's forward)
        if attn is None or type(attn.processor) not in (T.LTX2AudioVideoAttnProcessor, T.LTX2PerturbedAttnProcessor):
            return f"{name} does not use LTX2AudioVideoAttnProcessor (or LTX2PerturbedAttnProcessor)"
    for name in NORMS:
        norm = getattr(block, name, None)
        if type(norm) is not RMSNorm or norm.bias is not None:
            return f"{name} is not a diffusers RMSNorm without bias"
        if "forward" in norm.__dict__ or getattr(norm, "_diffusers_hook", None) is not None:
            return f"{name} carries a hook or an instance forward (layerwise casting, offloading)"
    return None


def _qk(rotations: dict[str, Callable], attn: LTXAttention, query, key, q_rope, k_rope):
    rotate = rotations.get(attn.rope_type) if q_rope is not None else None
    if rotate is None:  # no RoPE (the text cross-attentions), or a rope_type the processor does not apply
        return attn.norm_q(query), attn.norm_k(key)
    return rotate(query, attn.norm_q, q_rope), rotate(key, attn.norm_k, k_rope if k_rope is not None else q_rope)


def _attention(rotations: dict[str, Callable], attn: LTXAttention, hidden: torch.Tensor,
               context: torch.Tensor | None, mask: torch.Tensor | None, q_rope, k_rope,
               kv: tuple | None = None) -> torch.Tensor:
    """LTX2AudioVideoAttnProcessor (and LTX2PerturbedAttnProcessor unperturbed), op for op, its q/k norm
    + RoPE fused; `kv`: the text's normalised K and V made by the prompt memo."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    batch_size, sequence_length, _ = hidden.shape if context is None else context.shape
    if mask is not None:
        mask = attn.prepare_attention_mask(mask, sequence_length, batch_size)
        mask = mask.view(batch_size, attn.heads, -1, mask.shape[-1])
    if context is None:
        context = hidden
    gate_logits = attn.to_gate_logits(hidden) if attn.to_gate_logits is not None else None
    query = attn.to_q(hidden)
    if kv is not None:
        key, value = kv
        query = attn.norm_q(query)
    else:
        key, value = attn.to_k(context), attn.to_v(context)
        query, key = _qk(rotations, attn, query, key, q_rope, k_rope)
    query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
    proc = attn.processor
    with kernel_breaks(attn):
        out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                    backend=proc._attention_backend, parallel_config=proc._parallel_config)
    out = out.flatten(2, 3).to(query.dtype)
    if gate_logits is not None:  # LTX-2.3's per-head gates, the processor's ops
        out = out.unflatten(2, (attn.heads, -1))
        gates = 2.0 * torch.sigmoid(gate_logits)
        out = (out * gates.unsqueeze(-1)).flatten(2, 3)
    return attn.to_out[1](attn.to_out[0](out))


def _stacks(fx: Verifier, block: nn.Module) -> dict[str, TableStack]:
    """This installation's modulation stacks, the block registered in each of its tables'."""
    stacks = {}
    for name, table in _tables().items():
        stack = fx.shared.get(("ltx2_modulation", name))
        if stack is None:
            stack = fx.shared[("ltx2_modulation", name)] = TableStack(
                MODULATION_VIDEO, lambda table, t, batch: table[None, None] + t.reshape(batch, t.shape[1],
                                                                                        table.shape[0], -1),
                table=cast(Callable[[nn.Module], torch.Tensor], table))
        if not name.endswith("_prompt") or cast(_Block, block).cross_attn_adaln:
            stack.add(block)
        stacks[name] = stack
    return stacks


def text_states(fx: Verifier) -> tuple[PromptState, PromptState]:
    """The prompt memo's hand-over (ltx2_prompt.py) to the video and audio text cross-attentions."""
    return (fx.shared.setdefault("ltx2_prompt_video", PromptState()),
            fx.shared.setdefault("ltx2_prompt_audio", PromptState()))


def block_forward(block: nn.Module, fx: Verifier) -> Callable:
    call = fx.call
    b = cast(_Block, block)  # check_block pinned its children (nn.Module types them Tensor | Module)
    stacks = _stacks(fx, block)
    variance = chain(call, RMS_VARIANCE)
    rotations = {"interleaved": chain(call, QK_LTX), "split": chain(call, QK_LTX_SPLIT)}
    video_text, audio_text = text_states(fx)
    attns = [getattr(block, n) for n in ATTENTIONS]
    class_forward = type(block).forward

    def mod(name: str, temb: torch.Tensor, batch: int) -> tuple[torch.Tensor, ...]:
        """get_mod_params(table, temb, batch) for this block's `name` table, from the stack."""
        return stacks[name].get(call, block, temb, batch).unbind(dim=2)

    def norm_mod(x: torch.Tensor, norm: nn.Module, scale, shift) -> torch.Tensor:
        return rms_adaln(call, x, variance(x), norm, scale, shift)

    def prompt_mod(name: str, table: torch.Tensor, temb, like: torch.Tensor, batch: int) -> tuple:
        """LTX-2.3's text K/V modulation: from the prompt timestep, or the static table alone."""
        if temb is not None:
            return mod(name, temb, batch)
        return table[None, None].to(device=like.device, dtype=like.dtype).unbind(dim=2)

    def text_attention(attn, norm_h, text, mask, state: PromptState, scale_kv, shift_kv):
        if scale_kv is not None:  # LTX-2.3: each block modulates the text it attends to
            text = call(ADALN, text, scale_kv, shift_kv)
        return _attention(rotations, attn, norm_h, text, mask, None, None, kv=state.take_kv(attn, text))

    def forward(hidden_states, audio_hidden_states, encoder_hidden_states, audio_encoder_hidden_states, temb,
                temb_audio, temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                temb_prompt=None, temb_prompt_audio=None, video_rotary_emb=None, audio_rotary_emb=None,
                ca_video_rotary_emb=None, ca_audio_rotary_emb=None, encoder_attention_mask=None,
                audio_encoder_attention_mask=None, self_attention_mask=None, audio_self_attention_mask=None,
                a2v_cross_attention_mask=None, v2a_cross_attention_mask=None, use_a2v_cross_attention=True,
                use_v2a_cross_attention=True, perturbation_mask=None, all_perturbed=None):
        # a block without perturbed_attn ignores the perturbation arguments (as the class's forward does)
        perturbed = b.perturbed_attn and (perturbation_mask is not None
                                          or not (all_perturbed is None or all_perturbed is False))
        if perturbed or not all(inlinable(a) for a in attns):
            return class_forward(
                block, hidden_states=hidden_states, audio_hidden_states=audio_hidden_states,
                encoder_hidden_states=encoder_hidden_states, audio_encoder_hidden_states=audio_encoder_hidden_states,
                temb=temb, temb_audio=temb_audio, temb_ca_scale_shift=temb_ca_scale_shift,
                temb_ca_audio_scale_shift=temb_ca_audio_scale_shift, temb_ca_gate=temb_ca_gate,
                temb_ca_audio_gate=temb_ca_audio_gate, temb_prompt=temb_prompt, temb_prompt_audio=temb_prompt_audio,
                video_rotary_emb=video_rotary_emb, audio_rotary_emb=audio_rotary_emb,
                ca_video_rotary_emb=ca_video_rotary_emb, ca_audio_rotary_emb=ca_audio_rotary_emb,
                encoder_attention_mask=encoder_attention_mask,
                audio_encoder_attention_mask=audio_encoder_attention_mask, self_attention_mask=self_attention_mask,
                audio_self_attention_mask=audio_self_attention_mask, a2v_cross_attention_mask=a2v_cross_attention_mask,
                v2a_cross_attention_mask=v2a_cross_attention_mask, use_a2v_cross_attention=use_a2v_cross_attention,
                use_v2a_cross_attention=use_v2a_cross_attention, perturbation_mask=perturbation_mask,
                all_perturbed=all_perturbed)
        batch_size = hidden_states.size(0)

        # 1. Self-attention: video, then audio (a 9-row table adds LTX-2.3's text-query modulation)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, *text_q = mod("video", temb, batch_size)
        norm_h = norm_mod(hidden_states, b.norm1, scale_msa, shift_msa)
        attn_out = _attention(rotations, b.attn1, norm_h, None, self_attention_mask, video_rotary_emb, None)
        hidden_states = call(GATED_RESIDUAL, hidden_states, gate_msa, attn_out)

        a_shift_msa, a_scale_msa, a_gate_msa, a_shift_mlp, a_scale_mlp, a_gate_mlp, *a_text_q = mod(
            "audio", temb_audio, batch_size)
        norm_a = norm_mod(audio_hidden_states, b.audio_norm1, a_scale_msa, a_shift_msa)
        attn_out = _attention(rotations, b.audio_attn1, norm_a, None, audio_self_attention_mask, audio_rotary_emb,
                              None)
        audio_hidden_states = call(GATED_RESIDUAL, audio_hidden_states, a_gate_msa, attn_out)

        # 2. Cross-attention with the text (Q: video or audio; K, V: text)
        shift_kv = scale_kv = a_shift_kv = a_scale_kv = None
        if b.cross_attn_adaln:
            shift_kv, scale_kv = prompt_mod("video_prompt", b.prompt_scale_shift_table, temb_prompt,
                                            hidden_states, batch_size)
            a_shift_kv, a_scale_kv = prompt_mod("audio_prompt", b.audio_prompt_scale_shift_table,
                                                temb_prompt_audio, audio_hidden_states, batch_size)
        q_shift, q_scale, q_gate = text_q if b.video_cross_attn_adaln else (None, None, None)
        norm_h = norm_mod(hidden_states, b.norm2, q_scale, q_shift)
        attn_out = text_attention(b.attn2, norm_h, encoder_hidden_states, encoder_attention_mask, video_text,
                                  scale_kv, shift_kv)
        hidden_states = (call(GATED_RESIDUAL, hidden_states, q_gate, attn_out) if q_gate is not None
                         else hidden_states + attn_out)

        a_q_shift, a_q_scale, a_q_gate = a_text_q if b.audio_cross_attn_adaln else (None, None, None)
        norm_a = norm_mod(audio_hidden_states, b.audio_norm2, a_q_scale, a_q_shift)
        attn_out = text_attention(b.audio_attn2, norm_a, audio_encoder_hidden_states, audio_encoder_attention_mask,
                                  audio_text, a_scale_kv, a_shift_kv)
        audio_hidden_states = (call(GATED_RESIDUAL, audio_hidden_states, a_q_gate, attn_out) if a_q_gate is not None
                               else audio_hidden_states + attn_out)

        # 3. Audio-to-video (Q: video; K, V: audio) and video-to-audio: both read the streams as they
        # are here, each norm once (its variance) for two modulations
        if use_a2v_cross_attention or use_v2a_cross_attention:
            h, a = hidden_states, audio_hidden_states
            var_h, var_a = variance(h), variance(a)
            v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = mod("video_ca", temb_ca_scale_shift, batch_size)
            a2v_gate = mod("video_ca_gate", temb_ca_gate, batch_size)[0].squeeze(2)
            a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = mod("audio_ca", temb_ca_audio_scale_shift,
                                                                     batch_size)
            v2a_gate = mod("audio_ca_gate", temb_ca_audio_gate, batch_size)[0].squeeze(2)
            if use_a2v_cross_attention:
                q = rms_adaln(call, h, var_h, b.audio_to_video_norm, v_a2v_scale.squeeze(2), v_a2v_shift.squeeze(2))
                kv = rms_adaln(call, a, var_a, b.video_to_audio_norm, a_a2v_scale.squeeze(2), a_a2v_shift.squeeze(2))
                attn_out = _attention(rotations, b.audio_to_video_attn, q, kv, a2v_cross_attention_mask,
                                      ca_video_rotary_emb, ca_audio_rotary_emb)
                hidden_states = call(GATED_RESIDUAL, hidden_states, a2v_gate, attn_out)
            if use_v2a_cross_attention:
                kv = rms_adaln(call, h, var_h, b.audio_to_video_norm, v_v2a_scale.squeeze(2), v_v2a_shift.squeeze(2))
                q = rms_adaln(call, a, var_a, b.video_to_audio_norm, a_v2a_scale.squeeze(2), a_v2a_shift.squeeze(2))
                attn_out = _attention(rotations, b.video_to_audio_attn, q, kv, v2a_cross_attention_mask,
                                      ca_audio_rotary_emb, ca_video_rotary_emb)
                audio_hidden_states = call(GATED_RESIDUAL, audio_hidden_states, v2a_gate, attn_out)

        # 4. Feed-forwards (the modules' own calls) and their gated residuals
        norm_h = norm_mod(hidden_states, b.norm3, scale_mlp, shift_mlp)
        hidden_states = call(GATED_RESIDUAL, hidden_states, gate_mlp, b.ff(norm_h))
        norm_a = norm_mod(audio_hidden_states, b.audio_norm3, a_scale_mlp, a_shift_mlp)
        audio_hidden_states = call(GATED_RESIDUAL, audio_hidden_states, a_gate_mlp, b.audio_ff(norm_a))
        return hidden_states, audio_hidden_states

    def variant(*args, **kwargs):
        # K/V from the prompt memo: verified on their own
        text = kwargs.get("encoder_hidden_states", args[2] if len(args) > 2 else None)
        audio = kwargs.get("audio_encoder_hidden_states", args[3] if len(args) > 3 else None)
        return (isinstance(text, torch.Tensor) and video_text.has_kv(b.attn2, text),
                isinstance(audio, torch.Tensor) and audio_text.has_kv(b.audio_attn2, audio))

    return guarded("ltx2_block", block, forward, fx, variant=variant)


OPS = (MODULATION_VIDEO.name, *(op.name for op in RMS_VARIANCE), RMS_ADALN.name, ADALN.name, GATED_RESIDUAL.name,
       *(op.name for op in QK_LTX), *(op.name for op in QK_LTX_SPLIT))
