"""SANA's prompt state, made once per prompt batch under a graph instead of once per step.

Every SanaTransformer2DModel forward projects the caption (`caption_projection`: two GEMMs and a
GELU), normalises it (`caption_norm`, RMSNorm), and each block's cross-attention projects the
result to K and V (two GEMMs a block): 42 GEMMs a forward at SANA-1.6B, all from the prompt
embeddings alone, which a pipeline passes unchanged to every step. This rule makes all of them in
one memo break (bcg.memo): under a graph it re-runs only when the prompt embeddings (or those
weights) changed. The results are the same module calls on the same inputs, so the same bits; only
when they run moves. Without a graph (eager forwards, CPU) it is the same work as before, reordered.

    caption_projection(x)  -> the memo: P = projection(x), N = caption_norm(P), K_i/V_i = to_k_i/to_v_i(N);
                              returns P
    caption_norm(view of P) -> N   (only for a view of that very P, same shape and strides, unedited)
    block i's attn2(.., N)  -> K_i, V_i   (sana._cross_attention asks `PromptState.kv`)

Anything else (a caption path that differs, a block that is not fused) computes its own values.
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
from torch import nn

from ..breaks import memo_on_graph
from .prompt import PromptState
from .protocols import Attention


class _CaptionPath(Protocol):
    """SanaTransformer2DModel's caption path (check_model pins both modules)."""

    caption_projection: nn.Module
    caption_norm: nn.Module


def cross_attentions(model: nn.Module, check_block: Callable) -> list[Attention]:
    """The attn2 of each block the sana_block rule fuses (the ones that ask for K/V)."""
    try:
        from diffusers.models.transformers.sana_transformer import SanaAttnProcessor2_0
    except ImportError:
        return []
    return [b.attn2 for b in getattr(model, "transformer_blocks", [])
            if check_block(b) is None and getattr(b, "attn2", None) is not None
            and type(b.attn2.processor) is SanaAttnProcessor2_0]


def check_model(model: nn.Module, check_block: Callable) -> str | None:
    """Why this model's caption path cannot be swapped (None: it can)."""
    proj, norm = getattr(model, "caption_projection", None), getattr(model, "caption_norm", None)
    if type(proj).__name__ != "PixArtAlphaTextProjection" or not isinstance(norm, nn.Module):
        return "no PixArtAlphaTextProjection caption_projection + caption_norm"
    if "forward" in proj.__dict__ or "forward" in norm.__dict__:
        return "its caption path already has an instance forward (another wrapper or hook)"
    if model.training:
        return "it is in training mode"
    if not cross_attentions(model, check_block):
        return "none of its blocks takes the fused forward"
    return None


def caption_forwards(model: nn.Module, state: PromptState, check_block: Callable) -> dict[str, Callable]:
    """Instance forwards for `caption_projection` and `caption_norm` (the rule's installation)."""
    path = cast(_CaptionPath, model)  # nn.Module types its children Tensor | Module
    proj, norm = path.caption_projection, path.caption_norm
    attns = cross_attentions(model, check_block)
    proj_forward, norm_forward = type(proj).forward, type(norm).forward

    def params() -> list[torch.Tensor]:
        mods = [proj, norm] + [lin for a in attns for lin in (a.to_k, a.to_v)]
        return [p for m in mods for p in m.parameters()]

    def prompt_state(caption: torch.Tensor) -> tuple:
        projected = proj_forward(proj, caption)
        # The model normalises projected.view(batch, -1, dim): for a [batch, tokens, dim] caption
        # the same shape, so the same values; take_normed checks that it is.
        normed = norm_forward(norm, projected)
        return (projected, normed, *(t for a in attns for t in (a.to_k(normed), a.to_v(normed))))

    memo = memo_on_graph(prompt_state, params)

    def caption_projection(caption: torch.Tensor) -> torch.Tensor:
        projected, normed, *kv = memo(caption)
        state.put(projected, normed, {id(a): (kv[2 * i], kv[2 * i + 1]) for i, a in enumerate(attns)})
        return projected

    def caption_norm(hidden_states: torch.Tensor) -> torch.Tensor:
        normed = state.take_normed(hidden_states)
        return norm_forward(norm, hidden_states) if normed is None else normed

    caption_projection.__bcg_fusion__ = caption_norm.__bcg_fusion__ = "sana_prompt"  # type: ignore[attr-defined]
    return {"caption_projection": caption_projection, "caption_norm": caption_norm}
