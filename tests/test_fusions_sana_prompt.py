"""SANA's prompt state (bcg/fusions/sana_prompt.py) on the CPU op tape: the caption path and every
block's cross-attention K/V run once per prompt batch under a graph, not once per step, and every
step's output is still eager's, bit for bit; a new or edited prompt makes them again."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from bcg.fusions import install_fusions
from bcg.fusions.sana_prompt import PromptState
from tests.test_fusions import TINY, tiny_inputs, tiny_sana


def _kv_calls(model) -> list[int]:
    """Counts calls of every cross-attention's to_k / to_v (forward hooks)."""
    calls = [0]
    for blk in model.transformer_blocks:
        for lin in (blk.attn2.to_k, blk.attn2.to_v):
            lin.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _steps(n: int, dtype, seed: int = 0) -> list[dict]:
    """Denoising-step inputs: new latents and timestep each step, one prompt batch throughout."""
    base = tiny_inputs(dtype, seed=seed)
    out = []
    for i in range(n):
        step = tiny_inputs(dtype, seed=100 + i)
        out.append(dict(base, hidden_states=step["hidden_states"], timestep=step["timestep"]))
    return out


# inference_mode is the job's: inference tensors carry no version counter, so the call scope counts.
@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prompt_kv_made_once_per_prompt_batch_and_outputs_stay_eager(dtype, grad_mode):
    model = tiny_sana(dtype)
    steps, steps2 = _steps(4, dtype), _steps(2, dtype, seed=7)
    with grad_mode():
        refs = [model(**kw)[0] for kw in steps + steps2]
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="none")
        calls = _kv_calls(model)
        try:
            with runner.call_scope():  # one pipeline call (the job opens one per batch)
                outs = [model(**steps[0])[0]]  # warm-ups (eager) + capture
                made = calls[0]
                outs += [model(**kw)[0] for kw in steps[1:]]
                replay_calls = calls[0] - made
            with runner.call_scope():  # the next prompt batch: made again on its first step
                outs += [model(**kw)[0] for kw in steps2]
            c = runner.counters
        finally:
            runner.remove()
            fx.remove()
    assert all(torch.equal(o, r) for o, r in zip(outs, refs))
    # warm-ups + the capture make K and V of each block through the memo each time; the first
    # warm-up's verification (guard.py) also runs each block's own forward, which projects its own
    runs = RunnerConfig().warmup_iters + 1 + 1
    assert made == runs * 2 * TINY["num_layers"]
    assert replay_calls == 0  # three replays, no cross-attention K/V GEMM
    assert (c.hits, c.memo_reuses, c.memo_runs) == (5, 4, 1)


def test_an_edited_prompt_is_projected_again():
    model = tiny_sana(torch.float32)
    steps = _steps(3, torch.float32)
    with torch.no_grad():
        fx = install_fusions(model, backend="reference")
        runner = apply_graph_runner(model, RunnerConfig(backend="tape", fusions="off"), break_policy="none")
        try:
            model(**steps[0])
            steps[1]["encoder_hidden_states"].mul_(-1)  # the same tensor, edited in place
            out = model(**steps[1])[0]
            runs = runner.counters.memo_runs
        finally:
            runner.remove()
            fx.remove()
        ref = model(**steps[1])[0]
    assert runs == 1 and torch.equal(out, ref)


def test_caption_norm_takes_the_handoff_only_for_that_projection():
    state = PromptState()
    p, n = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    state.put(p, n, {})
    assert state.take_normed(p.view(2, -1, 4)) is n
    state.put(p, n, {})
    assert state.take_normed(p.clone()) is None  # other memory
    state.put(p, n, {})
    assert state.take_normed(p.view(6, 4)) is None  # another shape
    state.put(p, n, {})
    p.add_(1)
    assert state.take_normed(p) is None  # edited since


def test_kv_go_only_to_their_attention_with_that_normed_tensor():
    state = PromptState()
    p, n, k, v = (torch.randn(2, 3, 4) for _ in range(4))
    a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    state.put(p, n, {id(a): (k, v)})
    assert state.take_kv(a, n) is None  # caption_norm has not handed n on yet
    state.take_normed(p)
    assert state.take_kv(b, n) is None and state.take_kv(a, n.clone()) is None
    assert state.take_kv(a, n) == (k, v)
    assert state.take_kv(a, n) is None  # taken once


def test_the_job_reuses_the_prompt_state_across_a_batchs_steps():
    """The job's path: Pipeline.generate runs the SANA pipeline under inference_mode (inference
    tensors: no version counters), inside the runner's call scope. The prompt state is made once a
    batch and reused by its other steps, and the images are the eager engine's bytes."""
    from jobs.worker.pipeline import Pipeline
    from jobs.plan import Batch
    from padding import get_padder
    from tests.helpers import tiny_pipeline
    from tests.test_stages import SIG, items

    cfg, fam, pipe = tiny_pipeline("sana_tiny", "sampling.height=64", "sampling.width=64", "sampling.steps=3")
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    sig = dataclasses.replace(SIG, steps=3)
    batches = [Batch(sig, items(2, 0, sig), 2), Batch(sig, items(2, 2, sig), 2)]
    eager = [Pipeline(cfg, fam, pipe, padder, None, "cpu").generate(b) for b in batches]
    transformer = fam.transformer(pipe)
    fx = install_fusions(transformer, backend="reference")
    runner = apply_graph_runner(transformer, RunnerConfig(backend="tape", fusions="off"), break_policy="none")
    try:
        engine = Pipeline(cfg, fam, pipe, padder, runner, "cpu")
        graphed = []
        for b in batches:
            graphed.append(engine.generate(b))  # Dispatch.CAPTURE: the default
        c, stats = runner.counters, runner.stats()
    finally:
        runner.remove()
        fx.remove()
    for a, b in zip(eager, graphed):
        assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images))
    # 3 steps a batch, one transformer call each (CFG in one batch): batch 1 captures on its first
    # step and replays two; batch 2 replays three, the first re-making the prompt state.
    assert (c.captures, c.hits) == (1, 5)
    assert (c.memo_runs, c.memo_reuses) == (1, 4)
    from jobs.telemetry.summary import JobStats

    line = next(x for x in JobStats(graph=stats).lines() if x.lstrip().startswith("graphs:"))
    assert line.endswith("prompt state reused 4 / made 1 times on replay"), line
