"""The verifier's keys, whole-forward verification (guard.py) and the verdict cache (cache.py), on
the CPU with the reference backend: a rewritten forward that differs from the module's own is
rejected for its key and the module's own forward serves it; pointer alignment is part of a key; a
plan that turns out not to apply after it was verified falls back instead of raising; verdicts
persist across Verifier instances (runs) in the cache folder, and a new key verifies again."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from bcg.fusions import install_fusions, ops
from bcg.fusions.applicable import NotApplicable
from bcg.fusions.cache import ENV_DIR, ENV_SWITCH, VerdictCache
from bcg.fusions.guard import guarded
from bcg.fusions.keys import alignment, call_key
from bcg.fusions.verify import Verifier
from tests.test_fusions import TINY, tiny_inputs, tiny_sana


def _nudge(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, float("inf")))


def test_a_rewritten_forward_that_differs_is_rejected_for_its_key():
    norm = nn.LayerNorm(8)
    fx = Verifier("reference")
    fwd = guarded("test_norm", norm, lambda x: _nudge(type(norm).forward(norm, x)), fx)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        outs = [fwd(x) for _ in range(3)]
        assert all(torch.equal(o, norm(x)) for o in outs)  # the module's own bits every call
        c = fx.counters
        assert (c.forwards_verified, c.forwards_rejected) == (0, 1)
        assert "test_norm forward of LayerNorm" in c.rejections[0]
        fwd(x[:1])  # another shape: its own verdict
    assert c.forwards_rejected == 2


def test_an_equal_rewritten_forward_serves_its_key_with_its_own_outputs():
    norm = nn.LayerNorm(8)
    calls = []

    def fused(x):
        calls.append(x)
        return type(norm).forward(norm, x)

    fx = Verifier("reference")
    fwd = guarded("test_norm", norm, fused, fx)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        first, second = fwd(x), fwd(x)
    assert len(calls) == 2 and torch.equal(first, norm(x)) and torch.equal(second, first)
    assert (fx.counters.forwards_verified, fx.counters.forwards_rejected) == (1, 0)


def test_alignment_is_part_of_the_key():
    base = torch.zeros(64, dtype=torch.bfloat16)
    aligned, off2 = base[8:24], base[1:17]  # 16 bytes in, 2 bytes in
    assert alignment(aligned) == 16 and alignment(off2) == 2
    fx = Verifier("reference")
    assert fx.key(ops.GATED_RESIDUAL, (aligned,)) != fx.key(ops.GATED_RESIDUAL, (off2,))
    assert call_key((aligned,), {}) != call_key((off2,), {})


def _offset_plan(h, g, y):
    """A plan that needs storage offset 0 (which no key holds): applicable on a fresh tensor only."""
    if h.storage_offset() != 0:
        raise NotApplicable("a view into a larger buffer")
    return ops.GATED_RESIDUAL.reference(h, g, y)


def test_a_verified_plan_that_does_not_apply_falls_back_instead_of_raising():
    op = ops.Op("offset_plan", ops.GATED_RESIDUAL.eager, _offset_plan, _offset_plan)
    fx = Verifier("reference")
    buf = torch.randn(2, 2, 4, 8)
    h, g, y = buf[0], torch.randn(2, 1, 8), torch.randn(2, 4, 8)
    view = buf[1]  # same shape, strides, dtype and alignment (128 bytes in): the same key
    assert fx.key(op, (h, g, y)) == fx.key(op, (view, g, y))
    assert torch.equal(fx.call(op, h, g, y), ops.GATED_RESIDUAL.eager(h, g, y))  # verifies
    assert torch.equal(fx.call(op, view, g, y), ops.GATED_RESIDUAL.eager(view, g, y))  # falls back
    c = fx.counters
    assert (c.verified, c.not_applicable, c.fused_calls) == (1, 1, 0)
    fx.call(op, h, g, y)  # that key now runs eager for good
    assert c.eager_calls == 1


def test_verdicts_persist_across_runs_and_a_new_key_verifies(tmp_path):
    path = tmp_path / "verdicts.json"
    x, tab = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    args = (x, tab[:, 1:2], tab[:, 0:1])
    first = Verifier("reference", cache=VerdictCache(path))
    first.call(ops.ADALN, *args)
    assert first.counters.verified == 1 and json.loads(path.read_text())["verdicts"]
    again = Verifier("reference", cache=VerdictCache(path))  # the next run
    out = again.call(ops.ADALN, *args)
    assert torch.equal(out, ops.ADALN.eager(*args))
    assert (again.counters.verified, again.counters.cached, again.counters.fused_calls) == (0, 1, 1)
    again.call(ops.ADALN, x[:1], tab[:1, 1:2], tab[:1, 0:1])  # a new shape: compared
    assert again.counters.verified == 1


def test_a_rejection_persists_too(tmp_path):
    bad = ops.Op("adaln_bad", ops.ADALN.eager, lambda *a: _nudge(ops.ADALN.reference(*a)), ops.ADALN.fused)
    x, tab = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    args = (x, tab[:, 1:2], tab[:, 0:1])
    Verifier("reference", cache=VerdictCache(tmp_path / "v.json")).call(bad, *args)
    run2 = Verifier("reference", cache=VerdictCache(tmp_path / "v.json"))
    assert torch.equal(run2.call(bad, *args), ops.ADALN.eager(*args))
    assert (run2.counters.rejected, run2.counters.cached, run2.counters.eager_calls) == (0, 1, 1)


def test_whole_forward_verdicts_persist_for_the_same_model(tmp_path):
    kw = tiny_inputs(torch.bfloat16)
    runs = []
    for _ in range(2):  # two "runs": a fresh model, a fresh installation, the same cache folder
        model = tiny_sana(torch.bfloat16)
        with torch.inference_mode():
            ref = model(**kw)[0]
            fx = install_fusions(model, backend="reference")
            fx.verifier.cache = VerdictCache(tmp_path / "v.json")
            out = model(**kw)[0]
            fx.remove()
        assert torch.equal(out, ref)
        runs.append(fx.counters)
    assert runs[0].forwards_verified == TINY["num_layers"] + 2 and runs[0].cached == 0
    assert runs[1].forwards_verified == 0 and runs[1].verified == 0 and runs[1].cached > TINY["num_layers"]


def test_default_cache_location_and_switch(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    cache = VerdictCache.default()
    assert cache.path.parent == tmp_path / "fusions" and cache.env["sources"]
    assert Verifier("triton").cache.path == cache.path and Verifier("reference").cache is None
    monkeypatch.setenv(ENV_SWITCH, "off")
    assert VerdictCache.default() is None and Verifier("triton").cache is None


def test_the_batch_invariant_mode_verifies_into_a_cache_of_its_own(tmp_path, monkeypatch):
    # under bcg.invariant, eager runs the mode's kernels: a verdict against aten's eager (a default
    # job's) must not serve the mode's job, or a shape the default job saw runs fused and one it did
    # not runs the mode's eager, and a row's bytes follow its batch (session 44, SANA's decoder)
    from bcg.invariant import InvariantConfig, batch_invariant

    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    plain = VerdictCache.default()
    with batch_invariant(InvariantConfig(cuda="off")):
        inv = VerdictCache.default()
        assert Verifier("triton").cache.path == inv.path
    with batch_invariant(InvariantConfig(cuda="off", fast_paths=False)):
        assert VerdictCache.default().path == inv.path  # the fast paths give the same bytes
    with batch_invariant(InvariantConfig(cuda="off", reductions=False)):
        assert VerdictCache.default().path not in (inv.path, plain.path)  # another eager
    assert plain.env["invariant"] is None and inv.env["invariant"]["gemm"] is True
    assert inv.path != plain.path and VerdictCache.default().path == plain.path


def test_a_torn_cache_file_is_ignored(tmp_path, caplog):
    path = tmp_path / "v.json"
    path.write_text("{not json")
    cache = VerdictCache(path)
    assert cache.get(("op", 1)) is None and "ignoring the verdict cache" in caplog.text
    cache.put(("op", 1), True, "x")
    assert VerdictCache(path).get(("op", 1)) is True


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_fused_blocks_are_verified_as_wholes(grad_mode):
    """Every fused SANA block and the caption path's two modules are compared with their own forwards."""
    model = tiny_sana(torch.float32)
    kw = tiny_inputs(torch.float32)
    with grad_mode():
        ref = model(**kw)[0]
        fx = install_fusions(model, backend="reference")
        outs = [model(**kw)[0] for _ in range(2)]
        fx.remove()
    assert all(torch.equal(o, ref) for o in outs)
    c = fx.counters
    # the blocks with their input, caption projection and norm; block 1 a second time with the
    # norm its predecessor handed it, the blocks again with the prompt memo's K/V (the variants)
    assert c.forwards_rejected == 0 and c.forwards_verified >= TINY["num_layers"] + 2


def test_an_error_is_rejected_for_the_run_but_not_remembered(tmp_path):
    def oom(*a):
        raise RuntimeError("CUDA out of memory (a stand-in: nothing about the key)")

    op = ops.Op("oom_plan", ops.GATED_RESIDUAL.eager, oom, oom)
    h = torch.randn(1, 3, 4)
    run1 = Verifier("reference", cache=VerdictCache(tmp_path / "v.json"))
    assert torch.equal(run1.call(op, h, h[:, :1], h), ops.GATED_RESIDUAL.eager(h, h[:, :1], h))
    assert run1.counters.rejected == 1
    run2 = Verifier("reference", cache=VerdictCache(tmp_path / "v.json"))
    run2.call(op, h, h[:, :1], h)
    assert (run2.counters.cached, run2.counters.rejected) == (0, 1)  # compared (and failed) again


def test_a_chain_hands_calls_on_without_counting_them_as_eager_runs():
    # Session 46 read 2,128 "eager calls" in the mode's decode: RMSNorm's variance passing each call
    # past its rejected candidates to the one that agreed, which then ran fused every time.
    from bcg.fusions.verify import chain

    bad = ops.Op("adaln_bad", ops.ADALN.eager, lambda x, s, t: _nudge(ops.ADALN.reference(x, s, t)), ops.ADALN.fused)
    fx = Verifier("reference")
    run = chain(fx.call, (bad, ops.ADALN))
    x, s, t = torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    want = ops.ADALN.eager(x, s, t)
    outs = [run(x, s, t) for _ in range(3)]
    assert all(torch.equal(o, want) for o in outs)
    c = fx.counters
    assert (c.rejected, c.verified) == (1, 1)
    # call 1 is both candidates' first sight; calls 2 and 3 pass the rejected one by and run fused
    assert (c.handed_on, c.fused_calls, c.eager_calls) == (2, 2, 0), c
    # the chain's last candidate rejected too: its calls run eager, and count so
    fx2 = Verifier("reference")
    run2 = chain(fx2.call, (bad,))
    [run2(x, s, t) for _ in range(3)]
    assert (fx2.counters.handed_on, fx2.counters.eager_calls) == (0, 2), fx2.counters
