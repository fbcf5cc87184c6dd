"""MiniMax-H3's 64-row padding, on the real `MiniMaxH3Transformer3DModel` (tiny seeded config) and the
port's own layout builder (`MiniMaxH3PrepareLayoutStep.build_packed_sequence`):

- the port passes its blocks no attention mask, so rows appended to the packed sequence the way the
  reference pads it (to a multiple of 64) are attended, and change the video and audio outputs;
- kept a separate attention document (the reference's `cu_seqlens = [0, used, S]`, here a key mask
  in a test-only processor) they change nothing but reduction order (1e-5);
- so the padder refuses any length but the native one (padding/minimax_h3.py).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from padding import PaddingRefused, TextEmbeds, get_padder
from padding.minimax_h3 import GROUP, reference_padded_rows

TOL = 1e-5
TEXT_ROWS = 7


@pytest.fixture(scope="module")
def model():
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(0)
    return MiniMaxH3Transformer3DModel(num_attention_heads=2, attention_head_dim=24, hidden_size=32, num_layers=2,
                                       num_refiner_layers=1, ffn_dim=64, in_channels=4, audio_in_channels=4,
                                       patch_size=(1, 2, 2), text_dim=16, freq_dim=16, time_embed_hidden_dim=32,
                                       time_embed_dim=16, rope_freq_dim=4).eval()


def layout():
    """The port's t2va layout: 7 text rows, 2 latent frames of 4x4 (2x2 patches: 4 rows each), 5 audio latents x 2."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    pos, tags, video, audio, text, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(TEXT_ROWS, dtype=torch.long), num_latent_frames=2, latent_height=4, latent_width=4,
        num_audio_latents=5, patch_size=(1, 2, 2), audio_channels=2, audio_tag=2, video_tag=0)
    return pos.float(), tags, video, audio, text


def inputs(pad_rows: int = 0):
    pos, tags, video, audio, text = layout()
    g = torch.Generator().manual_seed(1)
    s = pos.shape[0]
    steps = torch.zeros(s, dtype=torch.long)
    steps[audio] = 1  # audio rows at their own noise level, as the two schedules give them
    if pad_rows:  # the reference's tail: rows no index addresses, tagged text, at timestep 0
        pos = torch.cat([pos, torch.zeros(pad_rows, 3)])
        tags = torch.cat([tags, torch.ones(pad_rows, dtype=torch.long)])
        steps = torch.cat([steps, torch.zeros(pad_rows, dtype=torch.long)])
    return dict(hidden_states=torch.randn(1, video.numel(), 16, generator=g),
                audio_hidden_states=torch.randn(1, audio.numel(), 4, generator=g),
                encoder_hidden_states=torch.randn(1, TEXT_ROWS, 16, generator=g),
                timestep=torch.tensor([0.6, 0.8]), timestep_indices=steps, token_tags=tags, position_ids=pos,
                video_indices=video, audio_indices=audio, text_indices=text, return_dict=False)


class SeparateDocuments:
    """The reference's varlen split as a key mask: rows below `used` see only each other (test only)."""

    def __init__(self, used: int):
        from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor

        self.inner, self.used = MiniMaxH3AttnProcessor(), used

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        s = hidden_states.shape[1]
        doc = torch.arange(s) >= self.used
        return self.inner(attn, hidden_states, rotary_emb, doc[:, None] == doc[None, :])


def run(model, kw):
    with torch.no_grad():
        return model(**kw)


def test_the_port_packs_without_padding_and_passes_no_mask(model):
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

    assert "attention_mask" not in inspect.signature(type(model).forward).parameters
    block_call = inspect.getsource(type(model).forward).split("hidden_states = block(")[1].split(")")[0]
    assert "mask" not in block_call  # blocks get no mask, though their attention would take one
    assert "attention_mask" in inspect.signature(MiniMaxH3TransformerBlock.forward).parameters
    rows = layout()[0].shape[0]
    assert rows == TEXT_ROWS + 2 * 4 + 5 * 2 == 25 and reference_padded_rows(rows) == GROUP


def test_reference_padding_changes_the_output_unless_kept_a_separate_document(model):
    base_video, base_audio = run(model, inputs())
    again = run(model, inputs())
    assert torch.equal(base_video, again[0]) and torch.equal(base_audio, again[1])
    used = layout()[0].shape[0]
    pad = reference_padded_rows(used) - used
    padded = inputs(pad)
    assert padded["position_ids"].shape[0] == GROUP
    video, audio = run(model, padded)
    assert (video - base_video).abs().max().item() > 1e-3 and (audio - base_audio).abs().max().item() > 1e-3
    # what the reference's cu_seqlens does: the pad rows a document of their own
    original = model.attn_processors
    try:
        model.set_attn_processor(SeparateDocuments(used))
        video, audio = run(model, padded)
    finally:
        model.set_attn_processor(original)
    assert (video - base_video).abs().max().item() <= TOL and (audio - base_audio).abs().max().item() <= TOL


def test_the_padder_keeps_the_native_length_and_refuses_padding():
    p = get_padder("minimax_h3", buckets=[64, 128], native_length=512)
    assert not p.masks_padding and [p.bucket_for(n) for n in (1, 7, 64, 65)] == [1, 7, 64, 65]
    text = TextEmbeds(embeds=torch.randn(1, TEXT_ROWS, 16), mask=torch.ones(1, TEXT_ROWS, dtype=torch.long))
    assert p.pad(text, TEXT_ROWS) is text
    for bucket in (4, 64):
        with pytest.raises(PaddingRefused, match="separate attention document"):
            p.pad(text, bucket)
