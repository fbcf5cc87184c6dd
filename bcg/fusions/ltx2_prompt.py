"""LTX-2's prompt memo: the text projections and every fused block's text cross-attention K/V, made once
per prompt batch instead of once per step (the pattern of prompt.py, as wan_prompt binds it).

LTX-2.0 projects the (connector) text once a forward, `caption_projection` for the video stream and
`audio_caption_projection` for the audio one, and every block's attn2 / audio_attn2 reads the result
unchanged: K = norm_k(to_k(P)) and V = to_v(P) are the same at every step. An instance forward on
each projection makes P and every fused block's K/V in one memo break (bcg.memo); each block takes its
K/V when called with P (seen through the model's `P.view(B, -1, D)`, unedited). 4 GEMMs a block a
forward fewer (~5% of LTX-2's transformer FLOPs at 480x832x49 with 1024 text tokens), for the K/V of
every block held: ~1.2 GB a batch element in bf16, per graph entry (CFG, STG and modality calls: one
each).

Not bound for LTX-2.3 / 2.5 (cross_attn_adaln): there the pipeline's connectors project the text (no
caption_projection), and each block modulates it before its K/V, by the timestep unless
use_prompt_adaln_single is off; those blocks make their K/V themselves.
"""

from __future__ import annotations

from typing import Callable, Protocol, cast

import torch
from torch import nn

from . import ltx2
from .guard import guarded
from .prompt import PromptState, projection_memo
from .verify import Verifier

PROJECTIONS = {"caption_projection": "attn2", "audio_caption_projection": "audio_attn2"}
"""Each text projection and the blocks' cross-attention that reads its output."""


class _Model(Protocol):
    training: bool
    transformer_blocks: nn.ModuleList


def _memo_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks whose text cross-attentions read the projections' output itself (fused, no text adaLN)."""
    return [b for b in cast(_Model, model).transformer_blocks
            if ltx2.check_block(b) is None and not getattr(b, "cross_attn_adaln", True)]


def check_model(model: nn.Module) -> str | None:
    for name in PROJECTIONS:
        proj = getattr(model, name, None)
        if type(proj).__name__ != "PixArtAlphaTextProjection":
            return f"no PixArtAlphaTextProjection {name} (LTX-2.3 and later: the pipeline's connectors project)"
        if "forward" in proj.__dict__:
            return f"its {name} already has an instance forward (another wrapper or hook)"
    if model.training:
        return "it is in training mode"
    if not _memo_blocks(model):
        return "none of its blocks takes the fused forward with the projected text as its K/V input"
    return None


def text_kv(attn: ltx2.LTXAttention, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A text cross-attention's K (normalised) and V, as LTX2AudioVideoAttnProcessor makes them."""
    return attn.norm_k(attn.to_k(text)), attn.to_v(text)


def _projection_forward(rule: str, proj: nn.Module, attns: list[ltx2.LTXAttention], state: PromptState,
                        fx: Verifier) -> Callable:
    return guarded(rule, proj, projection_memo(proj, attns, state, text_kv), fx)


def prompt_forwards(model: nn.Module, fx: Verifier) -> dict[str, Callable]:
    """Instance forwards for `caption_projection` and `audio_caption_projection`: each projection P of
    the prompt embeddings and every memo block's K/V of it, in one memo break."""
    blocks = _memo_blocks(model)
    states = dict(zip(PROJECTIONS, ltx2.text_states(fx)))
    return {name: _projection_forward("ltx2_prompt", model.get_submodule(name),
                                      [cast(ltx2.LTXAttention, getattr(b, attn)) for b in blocks], states[name], fx)
            for name, attn in PROJECTIONS.items()}
