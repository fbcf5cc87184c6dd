"""The demo trainer (tools/train_demo.py): its schedule, its text batches, and a resumed run end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tools import train_demo as T


def test_lr_warms_up_then_decays_to_its_floor_when_the_phase_ends():
    base, warmup = 1e-3, 10
    assert T.lr_at(0, 0.0, base, warmup) == pytest.approx(base / warmup)
    assert T.lr_at(9, 0.0, base, warmup) == pytest.approx(base)
    assert T.lr_at(50, 0.5, base, warmup) == pytest.approx(base * (0.1 + 0.9 * 0.5))
    assert T.lr_at(99, 1.0, base, warmup) == pytest.approx(0.1 * base)
    lrs = [T.lr_at(s, s / 100, base, warmup) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_budget_ends_on_steps_or_minutes_whichever_first():
    steps = T.Budget("x", 40, minutes=60, device=torch.device("cpu"))
    assert steps.progress(10) == pytest.approx(0.25, abs=1e-3) and steps.progress(40) >= 1
    clock = T.Budget("x", 10**9, minutes=1e-9, device=torch.device("cpu"))
    assert clock.progress(0) >= 1  # the minutes ran out before the first step


class _Pool:
    def __init__(self, lengths, dim=3, label=0):
        n, width = len(lengths), max(lengths)
        self.mask = torch.tensor([[1] * k + [0] * (width - k) for k in lengths])
        self.embeds = torch.arange(n * width * dim, dtype=torch.float32).view(n, width, dim) + 1
        self.labels = torch.full((n, 6), label)

    def __len__(self):
        return self.mask.shape[0]


def test_text_batches_have_one_fixed_length_and_keep_each_caption_mask():
    short, long = _Pool([2, 3, 1], label=1), _Pool([7, 5], label=2)
    empty = (torch.full((1, 2, 3), -1.0), torch.tensor([[1, 0]]))
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        embeds, masks, labels = T.batch_text((short, long), (6, 2), empty, 0.0, "cpu", gen)
        assert embeds.shape == (8, 7, 3) and masks.shape == (8, 7)  # the longest of any pool, every batch
        assert labels[:6, 0].eq(1).all() and labels[6:, 0].eq(2).all()
        for m in masks:
            n = int(m.sum())
            assert m[:n].all() and not m[n:].any()  # the caption's own tokens, then masked padding
        assert not embeds[:6, 3:].any() and not masks[:6, 3:].any()  # short rows padded past their pool
    embeds, masks, _ = T.batch_text((short, long), (6, 2), empty, 1.0, "cpu", gen)  # every caption dropped
    assert embeds[:, :2].eq(-1).all() and not embeds[:, 2:].any() and masks.sum(1).eq(1).all()


def test_a_resumed_run_continues_the_shipped_transformer_and_keeps_its_vae(tmp_path):
    from safetensors.torch import load_file

    from jobs.models import demo_weights

    out = tmp_path / "demo"
    args = ["--out", str(out), "--device", "cpu", "--resume", str(demo_weights.DEMO_DIR), "--dit-steps", "2",
            "--dit-batch", "2", "--long-fraction", "0.5", "--pool", "6", "--long-pool", "2", "--compile", "off",
            "--log-every", "1"]
    assert T.main(args) == 0
    record = json.loads((out / "training.json").read_text())
    shipped = json.loads((demo_weights.DEMO_DIR / "training.json").read_text())
    assert record["transformer"]["steps"] == 2 and record["resumed_from"] == shipped
    assert all(math.isfinite(v) for v in record["transformer"]["loss_per_log_every"])
    assert json.loads((out / "config.json").read_text()) == demo_weights.trained_config()
    vae, shipped_vae = load_file(str(out / "vae.safetensors")), load_file(str(demo_weights.DEMO_DIR / "vae.safetensors"))
    assert vae.keys() == shipped_vae.keys() and all(torch.equal(vae[k], shipped_vae[k]) for k in vae)
    before = load_file(str(demo_weights.DEMO_DIR / "transformer.safetensors"))
    after = load_file(str(out / "transformer.safetensors"))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
