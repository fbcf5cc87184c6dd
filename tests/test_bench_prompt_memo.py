"""benchmarks/sana_prompt_memo.py: the compiled baseline's prompt memo computes the model's own
function (bit for bit, eager, CPU), and reads the prompt state of its last begin()."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from sana_prompt_memo import PromptMemoForward, check, unsupported  # noqa: E402

TINY = dict(in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=16, num_layers=2,
            num_cross_attention_heads=2, cross_attention_head_dim=32, cross_attention_dim=64, caption_channels=48,
            sample_size=8)


def _model():
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(0)
    return SanaTransformer2DModel(**TINY).eval()


def _inputs(seed: int, rows: int = 2, text: int = 9):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, text, dtype=torch.long)
    mask[:, 6:] = 0
    return {"hidden_states": torch.randn(rows, 8, 4, 4, generator=g),
            "encoder_hidden_states": torch.randn(rows, text, 48, generator=g),
            "encoder_attention_mask": mask, "timestep": torch.full((rows,), 700.0)}


def test_memo_forward_equals_the_model_bit_for_bit():
    model = _model()
    assert unsupported(model) is None
    assert check(model, _inputs(0))


@torch.no_grad()
def test_the_forward_reads_the_last_begin():
    model = _model()
    memo = PromptMemoForward(model)
    a, b = _inputs(1), _inputs(2)
    memo.begin(a["encoder_hidden_states"])
    buffers = [t.data_ptr() for t in memo.buffers_]
    memo.begin(b["encoder_hidden_states"])  # a new prompt batch: the same buffers, refilled
    assert [t.data_ptr() for t in memo.buffers_] == buffers
    latent = {k: v for k, v in a.items() if k != "encoder_hidden_states"}
    out = memo(**latent)[0]
    assert torch.equal(out, model(**{**a, "encoder_hidden_states": b["encoder_hidden_states"]}, return_dict=False)[0])
    assert not torch.equal(out, model(**a, return_dict=False)[0])
