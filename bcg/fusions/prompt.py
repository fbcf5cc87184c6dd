"""Prompt memos: where a model's text path depends on the prompt embeddings alone (which a pipeline
passes unchanged to every step), it is made once per prompt batch under a graph (a bcg.memo break)
and handed to each block's cross-attention as K/V, instead of once per step.

    family        memo                                                   rule
    SANA          caption_projection, caption_norm, every block's        sana_prompt (sana_prompt.py)
                  attn2 K/V (42 GEMMs a forward at 1.6B)
    Wan 2.1/2.2   condition_embedder.text_embedder, every block's        wan_prompt (wan.py)
                  attn2 K (+ its RMSNorm) and V (60 GEMMs at 1.3B)
    LTX-2.0       caption_projection and audio_caption_projection,      ltx2_prompt (ltx2_prompt.py)
                  every block's attn2 / audio_attn2 K (+ its RMSNorm)
                  and V (192 GEMMs a forward at 48 layers)
    SANA-Video: the same pattern, not bound yet.
    Flux, LongCat-Image, Qwen-Image: none. Their double-stream blocks update the text tokens in every
    block of every step, so nothing in the text path is step-invariant past the input projection.

The results are the same module calls on the same inputs, so the same bits; only when they run
moves. `PromptState` is the hand-over from the memo to the blocks: each block takes its K/V only
for that very tensor (or a view of it with its shape and strides: LTX-2 hands its blocks
`P.view(B, -1, D)`; unedited since, by version counter), once.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..breaks import memo_on_graph
from ..memo import version
from .protocols import Attention


class PromptState:
    """What the last caption path made, handed to caption_norm and then to each block's attn2."""

    def __init__(self) -> None:
        self.projected: tuple | None = None  # (P, its version, N)
        self.kv: dict[int, tuple] = {}  # id(attn2) -> (K, V) made from `normed`
        self.normed: tuple | None = None  # (N, its version)

    def put(self, projected: torch.Tensor, normed: torch.Tensor, kv: dict[int, tuple]) -> None:
        """SANA's path: P (the projection), then N = caption_norm(P) handed over by `take_normed`,
        and the blocks' K/V made from N."""
        self.projected = (projected, version(projected), normed)
        self.normed, self.kv = None, kv

    def put_direct(self, projected: torch.Tensor, kv: dict[int, tuple]) -> None:
        """Wan's path: the blocks' cross-attentions read P itself, and their K/V were made from it."""
        self.projected, self.normed, self.kv = None, (projected, version(projected)), kv

    def take_normed(self, x: torch.Tensor) -> torch.Tensor | None:
        """N if `x` is P seen through a view of the same shape and strides, unedited since."""
        e, self.projected = self.projected, None
        if e is None:
            return None
        p, ver, n = e
        if (x.data_ptr() != p.data_ptr() or x.shape != p.shape or x.stride() != p.stride()
                or x.dtype != p.dtype or version(x) != ver):
            return None
        self.normed = (n, version(n))
        return n

    def has_kv(self, attn: nn.Module | Attention, encoder_hidden_states: torch.Tensor) -> bool:
        """Whether `take_kv` would hand this attention its K/V (without taking them)."""
        e = self.normed
        return e is not None and _same(encoder_hidden_states, *e) and id(attn) in self.kv

    def take_kv(self, attn: nn.Module | Attention, encoder_hidden_states: torch.Tensor) -> tuple | None:
        """(K, V) for this attention if it is called with that very N (or a view of it like it), unedited."""
        e = self.normed
        if e is None or not _same(encoder_hidden_states, *e):
            return None
        return self.kv.pop(id(attn), None)


def _same(x: torch.Tensor, held: torch.Tensor, ver: int | None) -> bool:
    """x is `held`, or a view of it with its shape, strides, dtype and device (the state holds it, so no
    other tensor lives at its address), and neither was edited since `ver`."""
    if x is not held and (x.data_ptr() != held.data_ptr() or x.shape != held.shape or x.stride() != held.stride()
                          or x.dtype != held.dtype or x.device != held.device):
        return False
    return version(x) == ver


def projection_memo(proj: nn.Module, attns: Sequence[Any], state: PromptState,
                    text_kv: Callable[[Any, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward for a text projection whose output P every one of `attns` reads as its cross-attention
    text (Wan's and LTX-2's path): P and each attention's `text_kv(attn, P)` made in one memo break
    (bcg.memo), the K/V handed to `state` for the blocks to take. `text_kv` reads each attention's
    to_k, to_v and norm_k: the memo re-runs when one of their parameters changes (a LoRA fused in)."""
    proj_forward = type(proj).forward

    def params() -> list[torch.Tensor]:
        mods = [proj] + [m for a in attns for m in (a.to_k, a.to_v, a.norm_k)]
        return [p for m in mods for p in m.parameters()]

    def text_state(text: torch.Tensor) -> tuple:
        projected = proj_forward(proj, text)
        return (projected, *(t for a in attns for t in text_kv(a, projected)))

    memo = memo_on_graph(text_state, params)

    def forward(text: torch.Tensor) -> torch.Tensor:
        projected, *kv = memo(text)
        state.put_direct(projected, {id(a): (kv[2 * i], kv[2 * i + 1]) for i, a in enumerate(attns)})
        return projected

    return forward
