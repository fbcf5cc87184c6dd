"""The padding contract: text embeddings, and what a padder may do to them.

A padder knows nothing of graphs: it maps a prompt's text length to a *bucket* (the text length the
denoiser will see) and reshapes a batch of encoded prompts to that bucket. Prompts of different
lengths in one bucket then share one graph signature.

The invariant every padder owes: where it changes a length, the image must not change. That holds
only where the model masks padding in attention; a padder for a model that attends to its padding
declares `masks_padding = False` and refuses to change lengths.

Policy apart from mechanism: the planner asks `bucket_for` of every prompt and never touches a
tensor, so nothing here imports torch at module level (tests/test_plan_imports.py); the tensor
work (`TextEmbeds.grown`, a padder's `pad`) runs only in the worker, which has torch loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, Optional

if TYPE_CHECKING:
    import torch


@dataclass
class TextEmbeds:
    """One side (positive or negative) of a batch of encoded prompts."""

    embeds: torch.Tensor  # [B, S, D]
    mask: Optional[torch.Tensor]  # [B, S], 1 = real token, 0 = padding
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)  # family-specific, e.g. rotary tables

    @property
    def length(self) -> int:
        return int(self.embeds.shape[1])

    def used_length(self) -> int:
        """Positions up to the last real token (the mask is a prefix of ones after right padding)."""
        if self.mask is None:
            return self.length
        real = self.mask.bool().any(dim=0).nonzero()
        return int(real.max()) + 1 if real.numel() else 1

    def with_length(self, embeds: torch.Tensor, mask: Optional[torch.Tensor]) -> "TextEmbeds":
        return replace(self, embeds=embeds, mask=mask)

    def cut(self, length: int) -> "TextEmbeds":
        """The first `length` positions (the caller checked that only mask-0 positions go)."""
        assert self.mask is not None, "only masked text can be cut"
        return self.with_length(self.embeds[:, :length], self.mask[:, :length])

    def grown(self, length: int) -> "TextEmbeds":
        """Zero embeddings under mask 0 appended up to `length` positions."""
        import torch.nn.functional as F

        assert self.mask is not None, "only masked text can grow"
        extra = length - self.length
        return self.with_length(F.pad(self.embeds, (0, 0, 0, extra)), F.pad(self.mask, (0, extra)))


class PaddingRefused(RuntimeError):
    """Raised when asked to change the text length of a model that attends to its padding."""


class Padder:
    """Base class: `bucket_for` plans, `pad` reshapes; subclasses set the policy."""

    #: registry name; one padder per model family
    name: str = ""
    #: True only where the model's attention ignores masked text positions exactly
    masks_padding: bool = False

    def bucket_for(self, length: int) -> int:
        raise NotImplementedError

    def pad(self, text: TextEmbeds, bucket: int) -> TextEmbeds:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} (masks padding: {self.masks_padding})"
