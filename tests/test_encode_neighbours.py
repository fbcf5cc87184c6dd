"""At one batch shape a prompt's text embedding is a function of the prompt: the same alone, beside
longer prompts and beside shorter ones, for every family's text encoder (issue 30: the contract's
encode stage; the transformers' rows are tests/test_batch_invariance.py's).

Qwen-Image's pipeline pads a call's prompts to the longest, and on this CPU a prompt beside longer
ones got other bytes than beside its own length, so its family encodes one prompt a call
(jobs/models/qwen_image.py). MiniMax-H3 refuses a batch of several token lengths (its plan buckets each
length apart), so its neighbours here have the prompt's length.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_pipeline

SHORT = "a red fox"
LONGER = "a red fox sitting by a quiet misty lake in the morning light, an old stone bridge behind it " * 3
SAME_LENGTH = "a blue owl"  # MiniMax-H3: one token count a batch
PRESETS = ["sana_tiny", "flux_tiny", "qwen_image_tiny", "z_image_tiny", "longcat_image_tiny", "glm_image_tiny",
           "wan_tiny", "sana_video_tiny", "ltx2_tiny", "minimax_h3_tiny"]


def _row0(text):
    n = int(text.mask[0].sum()) if text.mask is not None else text.embeds.shape[1]
    extras = {k: v[0] for k, v in (text.extras or {}).items() if isinstance(v, torch.Tensor)}
    return text.embeds[0, :n], extras


@pytest.mark.parametrize("preset", PRESETS)
def test_a_prompts_embedding_does_not_depend_on_its_neighbours(preset):
    cfg, fam, pipe = tiny_pipeline(preset)
    others = [SAME_LENGTH] if preset == "minimax_h3_tiny" else [LONGER, "an owl"]

    def first_row(batch):
        with torch.inference_mode():
            return _row0(fam.encode(pipe, batch, cfg.model, "cpu", instruction=True))

    want, want_extras = first_row([SHORT] * 8)
    for other in others:
        for batch in ([SHORT] + [other] * 7, [SHORT]):
            got, extras = first_row(batch)
            assert got.shape == want.shape and torch.equal(got, want), (preset, other, len(batch))
            assert all(torch.equal(extras[k], want_extras[k]) for k in want_extras), (preset, other)
