"""Memo breaks (bcg.memo) on the CPU op tape: a memo re-runs only when the live tensor behind its
input is new or edited (or a weight it reads was edited), every replay equals eager, and a memo
fed by something the graph computed runs on every replay."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from bcg import RunnerConfig, apply_graph_runner, memo, memo_on_graph


class PromptModel(nn.Module):
    """A denoiser-shaped toy: `x` changes every step, `text` is the same through a call; the text
    projection is the memo (the part SANA's caption path and cross-attention K/V play)."""

    def __init__(self, memo_on_text: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 6)
        self.out = nn.Linear(6, 6)
        self.runs = 0
        self.memo_on_text = memo_on_text

        def project(text):
            self.runs += 1
            k = self.proj(text)
            return k, k.mean(dim=1, keepdim=True)

        self.project = memo_on_graph(project, lambda: list(self.proj.parameters()))

    def forward(self, x, text):
        src = text if self.memo_on_text else text * 1  # `text * 1` is computed in the graph
        k, m = self.project(src)
        return self.out(x + k.sum(dim=1, keepdim=True) + m)


def _runner(model):
    return apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off",
                                                  warmup_iters=1), break_policy="none")


def _eager(model, x, text):
    return PromptModel.forward(model, x, text)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_memo_reruns_only_when_its_input_changes(grad_mode):
    model = PromptModel()
    runner = _runner(model)
    with grad_mode():
        text = torch.randn(2, 5, 6)
        with runner.call_scope():
            for step in range(4):  # the capture, then three replays with the same text
                x = torch.randn(2, 5, 6)
                assert torch.equal(model(x, text), _eager(model, x, text)), step
            assert runner.counters.hits == 3 and runner.counters.memo_reuses == 3
            assert runner.counters.memo_runs == 0
        text2 = torch.randn(2, 5, 6)  # a new prompt batch (a new scope, as the job opens per batch)
        with runner.call_scope():
            x = torch.randn(2, 5, 6)
            runs = model.runs
            assert torch.equal(model(x, text2), _eager(model, x, text2))
            assert model.runs == runs + 2 and runner.counters.memo_runs == 1  # replay re-ran it, eager ran it
    assert runner.stats()["entries"][0]["memo_breaks"] == 1
    runner.remove()


def test_memo_sees_in_place_edits_of_its_input_and_its_weights():
    model = PromptModel()
    runner = _runner(model)
    with torch.no_grad():
        text = torch.randn(2, 5, 6)
        x = torch.randn(2, 5, 6)
        model(x, text)  # capture
        model(x, text)
        assert runner.counters.memo_reuses == 1
        text.mul_(2)  # the same object, edited: its version moved
        assert torch.equal(model(x, text), _eager(model, x, text))
        assert runner.counters.memo_runs == 1
        model.proj.weight.add_(0.5)  # a weight the memo reads, edited in place (a LoRA fused)
        assert torch.equal(model(x, text), _eager(model, x, text))
        assert runner.counters.memo_runs == 2
        model.out.weight.add_(0.5)  # a weight only the graph reads: the memo stays
        assert torch.equal(model(x, text), _eager(model, x, text))
        assert runner.counters.memo_runs == 2 and runner.counters.memo_reuses == 2
    runner.remove()


def test_inference_tensors_outside_a_call_scope_rerun_every_time():
    """No version counter and no caller's promise: the memo cannot know, so it re-runs."""
    model = PromptModel()
    runner = _runner(model)
    with torch.inference_mode():
        text = torch.randn(2, 5, 6)
        for _ in range(3):
            x = torch.randn(2, 5, 6)
            assert torch.equal(model(x, text), _eager(model, x, text))
    assert runner.counters.memo_runs == 2 and runner.counters.memo_reuses == 0
    runner.remove()


def test_memo_fed_by_the_graph_is_a_plain_break(caplog):
    memo._logged.clear()
    model = PromptModel(memo_on_text=False)
    runner = _runner(model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="bcg.memo"):
        text = torch.randn(2, 5, 6)
        for _ in range(3):
            x = torch.randn(2, 5, 6)
            runs = model.runs
            assert torch.equal(model(x, text), _eager(model, x, text))
        assert model.runs == runs + 2  # the replay ran it (every time), then the eager reference
    assert runner.counters.memo_reuses == 0 and runner.stats()["entries"][0]["memo_breaks"] == 0
    assert sum("re-runs on every replay" in r.getMessage() for r in caplog.records) == 1
    runner.remove()


def test_memo_is_fn_outside_a_capture():
    model = PromptModel()
    text, x = torch.randn(2, 5, 6), torch.randn(2, 5, 6)
    with torch.no_grad():
        assert torch.equal(model(x, text), model(x, text)) and model.runs == 2
