"""Break installation and the runner on a real tiny diffusers SanaTransformer2DModel (CPU tape)."""

import logging

import pytest
import torch
from diffusers import SanaTransformer2DModel
from diffusers.models.modeling_outputs import Transformer2DModelOutput

from bcg import Dispatch, GraphRunner, RunnerConfig, apply_graph_runner, count_breaks, install_breaks, remove_breaks

LAYERS = 2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Two intra-op threads on a busy 2-core box spin against each other: 150x slower here.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SanaTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
        num_layers=LAYERS, num_cross_attention_heads=2, cross_attention_head_dim=8,
        cross_attention_dim=16, caption_channels=24, sample_size=8,
    ).eval()


def inputs(batch=2, text=12, real=5, seed=1, **extra):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, text, dtype=torch.long)
    mask[:, :real] = 1
    kw = dict(
        hidden_states=torch.randn(batch, 4, 8, 8, generator=g),
        encoder_hidden_states=torch.randn(batch, text, 24, generator=g),
        encoder_attention_mask=mask,
        timestep=torch.tensor([500.0 + seed]).expand(batch),  # expanded, as pipelines pass it
        return_dict=False,
    )
    kw.update(extra)
    return kw


@pytest.fixture
def tape(model):
    runners = []

    def apply(break_policy="none", **cfg):
        r = apply_graph_runner(model, RunnerConfig(backend="tape", **cfg), break_policy=break_policy)
        runners.append(r)
        return r

    yield apply
    for r in runners:
        r.remove()


# -- break installation ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy, expected",
    [("none", 0), ("attention", 2 * LAYERS), (["transformer_blocks.0.attn2"], 1),
     (["SanaTransformerBlock"], LAYERS), (["GLUMBConv", "transformer_blocks.1.attn1"], LAYERS + 1)],
)
def test_break_counts_per_policy(model, policy, expected):
    assert install_breaks(model, policy) == expected
    assert count_breaks(model) == expected
    assert remove_breaks(model) == expected
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_unknown_break_names_raise_with_the_fix(model):
    with pytest.raises(ValueError, match="transformer_blocks.9.attn2.*match no module"):
        install_breaks(model, ["transformer_blocks.9.attn2"])
    with pytest.raises(ValueError, match="break_policy='everything'"):
        install_breaks(model, "everything")


def test_installed_breaks_leave_eager_outputs_unchanged(model):
    with torch.no_grad():
        ref = model(**inputs())[0]
        install_breaks(model, "attention")
        try:
            out = model(**inputs())[0]
        finally:
            remove_breaks(model)
    assert torch.equal(ref, out)


# -- replay equals eager ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy, segments",
    [("none", 1), ("attention", LAYERS + 1), (["SanaTransformerBlock"], LAYERS + 1)],
)
@torch.no_grad()
def test_replay_equals_eager_bit_for_bit(model, tape, policy, segments):
    refs = {(t, s): model(**inputs(text=t, seed=s))[0] for t in (12, 16) for s in (1, 2, 3)}
    r = tape(break_policy=policy)
    for (t, s), ref in refs.items():  # per text length: capture (seed 1), then two replays
        assert torch.equal(model(**inputs(text=t, seed=s))[0], ref), (policy, t, s)
    st = r.stats()
    assert (st["captures"], st["hits"], st["misses"]) == (2, 4, 0)
    assert [e["segments"] for e in st["entries"]] == [segments, segments]
    assert st["segments"] == 2 * segments


def _forwards(module):
    """A counter of `module`'s real forwards (a graph replay runs none: it replays recorded ops)."""
    calls = []
    handle = module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


@torch.no_grad()
@pytest.mark.parametrize("policy", ["none", "attention"])
def test_live_warmup_runs_the_first_calls_eager_then_captures_without_extra_forwards(model, tape, policy):
    """warmup="live": a signature's first warmup_iters calls are its warm-up, run eager on their own
    inputs; the next call captures with one forward (its own); every call gives eager's bytes."""
    refs = [model(**inputs(seed=s))[0] for s in (1, 2, 3, 4)]
    calls, handle = _forwards(model.transformer_blocks[0])
    try:
        r = tape(break_policy=policy, warmup="live", warmup_iters=2)
        seen = []
        for s, ref in zip((1, 2, 3, 4), refs):
            assert torch.equal(model(**inputs(seed=s))[0], ref), s
            c = r.counters
            seen.append((c.warmups, c.captures, c.hits, c.misses, len(calls)))
    finally:
        handle.remove()
    # calls 1-2: eager, one forward each; call 3: the capture, one forward; call 4: a replay, none
    assert seen == [(1, 0, 0, 0, 1), (2, 0, 0, 0, 2), (2, 1, 0, 0, 3), (2, 1, 1, 0, 3)]
    assert r.stats()["warmups"] == 2


@torch.no_grad()
def test_random_warmup_runs_extra_forwards_inside_the_first_call(model, tape):
    ref = model(**inputs(seed=1))[0]
    calls, handle = _forwards(model.transformer_blocks[0])
    try:
        r = tape(warmup="random", warmup_iters=2)
        assert torch.equal(model(**inputs(seed=1))[0], ref)
    finally:
        handle.remove()
    assert (r.counters.warmups, r.counters.captures, len(calls)) == (0, 1, 3)  # 2 warm-ups + the capture


@torch.no_grad()
def test_live_warmup_counts_each_signature_and_zero_iters_captures_at_once(model, tape):
    r = tape(warmup="live", warmup_iters=1)
    for text in (12, 16, 12, 16):
        model(**inputs(text=text))
    assert (r.counters.warmups, r.counters.captures, r.counters.hits) == (2, 2, 0)
    r.remove()
    r = tape(warmup="live", warmup_iters=0)
    model(**inputs())
    assert (r.counters.warmups, r.counters.captures) == (0, 1)


def test_an_unknown_warmup_names_the_choices():
    with pytest.raises(ValueError, match="bcg.warmup='hot'.*random, live"):
        RunnerConfig(warmup="hot")


@torch.no_grad()
def test_output_dataclass_keeps_its_type(model, tape):
    ref = model(**inputs(return_dict=True)).sample
    tape()
    for _ in range(2):
        out = model(**inputs(return_dict=True))
        assert isinstance(out, Transformer2DModelOutput)
        assert torch.equal(out.sample, ref) and torch.equal(out[0], ref)


@torch.no_grad()
def test_two_calls_never_share_output(model, tape):
    ref_a, ref_b = model(**inputs(seed=1))[0], model(**inputs(seed=2))[0]
    r = tape()
    model(**inputs(seed=3))  # capture
    a = model(**inputs(seed=1))[0]  # e.g. the conditional CFG branch
    b = model(**inputs(seed=2))[0]  # the unconditional one, same signature
    assert a is not b and a.data_ptr() != b.data_ptr()
    assert torch.equal(a, ref_a) and torch.equal(b, ref_b)  # a was not overwritten by b
    assert all(a.data_ptr() != t.data_ptr() for e in r.entries() for t in [e.output[0]])


# -- misses, caps, failures ------------------------------------------------------------------
@torch.no_grad()
def test_miss_runs_eager_counts_and_logs_once_with_the_difference(model, tape, caplog):
    ref = model(**inputs(text=16))[0]
    r = tape()
    model(**inputs(text=12))  # captured
    r.dispatch = Dispatch.REPLAY  # what exists replays; a new signature is a counted miss
    with caplog.at_level(logging.WARNING, logger="bcg"):
        out1 = model(**inputs(text=16))[0]
        out2 = model(**inputs(text=16))[0]
    assert torch.equal(out1, ref) and torch.equal(out2, ref)
    assert (r.counters.hits, r.counters.misses, r.counters.captures) == (0, 2, 1)
    missed = [rec.getMessage() for rec in caplog.records if "MISSED" in rec.getMessage()]
    assert len(missed) == 1
    assert "encoder_hidden_states: shape (2, 12, 24) vs (2, 16, 24)" in missed[0]
    assert "encoder_attention_mask: shape (2, 12) vs (2, 16)" in missed[0]


@torch.no_grad()
def test_lru_eviction_at_max_graphs(model, tape):
    r = tape(max_graphs=2)
    for t in (12, 16, 20):
        model(**inputs(text=t))
    assert (r.counters.captures, r.counters.evictions, len(r.entries())) == (3, 1, 2)
    model(**inputs(text=16))   # still live: a hit
    model(**inputs(text=12))   # evicted first: captured again, evicting 20 (least recent)
    assert (r.counters.hits, r.counters.captures, r.counters.evictions) == (1, 4, 2)
    assert sorted(e.static_inputs[1].shape[1] for e in r.entries()) == [12, 16]


@torch.no_grad()
def test_graph_bytes_bound(model, tape, caplog):
    ref = model(**inputs())[0]
    r = tape(max_graph_memory_gb=1e-9)  # 1 byte
    with caplog.at_level(logging.WARNING, logger="bcg"):
        first = model(**inputs())[0]
        second = model(**inputs())[0]
    assert torch.equal(first, ref) and torch.equal(second, ref)
    assert r.counters.captures == 1 and r.counters.misses == 1 and not r.entries()
    assert r.counters.graph_bytes == 0
    assert any("max_graph_memory_gb" in rec.getMessage() for rec in caplog.records)


def test_release_all_frees_and_recaptures(model, tape):
    r = tape()
    with torch.no_grad():
        model(**inputs())
        assert r.counters.graph_bytes > 0
        r.release_all()
        assert r.stats()["live_entries"] == 0 and r.counters.graph_bytes == 0
        model(**inputs())
    assert (r.counters.captures, r.counters.releases, r.counters.peak_graph_bytes > 0) == (2, 1, True)


class HostReading(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.abs().max().item() > 1e9:  # a host read: no graph can capture it
            y = y * 0
        return y + 1


def test_failed_capture_runs_eager_with_one_clear_line(caplog):
    m = HostReading()
    x = torch.randn(3, 4)
    with torch.no_grad():
        ref = m(x)
        r = apply_graph_runner(m, RunnerConfig(backend="tape"))
        with caplog.at_level(logging.WARNING, logger="bcg"):
            out1, out2 = m(x), m(x)
    r.remove()
    assert torch.equal(out1, ref) and torch.equal(out2, ref)
    st = r.stats()
    assert (st["capture_failures"], st["captures"], st["misses"], st["hits"]) == (1, 0, 2, 0)
    failed = [rec.getMessage() for rec in caplog.records if "capture failed" in rec.getMessage()]
    assert len(failed) == 1 and "_local_scalar_dense" in failed[0] and "runs eager" in failed[0]


def test_debug_mode_catches_a_moved_static_buffer(model, tape):
    r = tape(debug_check_buffers=True)
    with torch.no_grad():
        model(**inputs())
        model(**inputs())  # the check passes on a healthy entry
        entry = r.entries()[0]
        entry.static_inputs[0].set_(entry.static_inputs[0].clone())  # same values, new address
        with pytest.raises(RuntimeError, match="moved since capture"):
            model(**inputs())


def test_autograd_enabled_runs_eager(model, tape):
    r = tape()
    model(**inputs())
    assert (r.counters.misses, r.counters.captures) == (1, 0)


# -- wiring ----------------------------------------------------------------------------------
def test_no_cuda_default_steps_aside_with_one_line(model, caplog):
    with caplog.at_level(logging.INFO, logger="bcg"):
        r = apply_graph_runner(model)
    try:
        with torch.no_grad():
            model(**inputs())
            model(**inputs(text=16))
        st = r.stats()
        assert (st["mode"], st["hits"], st["misses"], st["captures"]) == ("eager", 0, 0, 0)
        assert count_breaks(model) == 0
        lines = [rec.getMessage() for rec in caplog.records]
        assert len(lines) == 1 and "runs eager" in lines[0] and "no CUDA" in lines[0]
    finally:
        r.remove()


def test_apply_twice_raises_and_remove_restores(model):
    r = apply_graph_runner(model, RunnerConfig(backend="tape"), break_policy="attention")
    assert model.forward is r and count_breaks(model) == 2 * LAYERS
    with pytest.raises(RuntimeError, match="remove"):
        apply_graph_runner(model, RunnerConfig(backend="tape"))
    r.remove()
    assert "forward" not in model.__dict__ and count_breaks(model) == 0
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_config_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="bcg.backend='gpu'"):
        RunnerConfig(backend="gpu")
    with pytest.raises(ValueError, match="bcg.max_graphs=0"):
        RunnerConfig(max_graphs=0)
    with pytest.raises(ValueError, match="not module names"):
        GraphRunner(lambda: None, RunnerConfig(backend="tape"), break_policy=["ok", ""])
    with pytest.raises(RuntimeError, match="bcg.backend=cuda"):
        GraphRunner(lambda: None, RunnerConfig(backend="cuda"), device=torch.device("cpu"))


@torch.no_grad()
def test_static_inputs_keep_the_live_layout(model, tape):
    """A channels-last latent is captured into a channels-last static buffer, and replays on it (the
    graph must compute on the layout eager saw: tests/test_bcg_signature.py says why); an expanded
    timestep, which cannot be written in place with stride 0, gets a contiguous one."""
    r = tape()
    kw = inputs()
    kw["hidden_states"] = kw["hidden_states"].contiguous(memory_format=torch.channels_last)
    ref = model(**kw)[0]
    model(**inputs(seed=3, hidden_states=kw["hidden_states"].clone(memory_format=torch.channels_last)))
    (entry,) = r.entries()
    static = dict(zip(["encoder_attention_mask", "encoder_hidden_states", "hidden_states", "timestep"],
                      entry.static_inputs))
    assert static["hidden_states"].stride() == kw["hidden_states"].stride() != kw["hidden_states"].contiguous().stride()
    assert static["timestep"].is_contiguous() and kw["timestep"].stride() == (0,)
    model(**inputs())  # the contiguous latent: a second key, its own contiguous buffer
    assert r.counters.captures == 2 and r.counters.hits == 1
    assert torch.equal(model(**kw)[0], ref) and r.counters.hits == 2
