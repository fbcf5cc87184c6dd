"""The stage pipeline gives the serial path's bytes; the scheduler keeps order, stops cleanly,
and the capture policy captures only what pays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jobs.worker.dispatcher import CaptureDispatcher, CapturePolicy
from jobs.worker.pipeline import Pipeline
from jobs.models.base import DenoiseRequest
from jobs.worker.pixels import to_uint8, to_uint8_torch
from jobs.plan import Batch, Item, Signature, derive_seed
from jobs.worker.scheduler import StageScheduler, batches_left_in_run
from padding import get_padder
from tests.helpers import tiny_pipeline

SIG = Signature(height=64, width=64, text_bucket=64, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")


def items(n: int, start: int = 0, sig: Signature = SIG):
    return [Item(key=f"k{i}", prompt=f"a lighthouse on a cliff at dusk, number {i}", negative_prompt="",
                 seed=derive_seed(0, f"k{i}"), signature=sig, text_tokens=12, truncated=False, source=f"t:{i + 1}")
            for i in range(start, start + n)]


def test_pixels_rule_is_the_same_on_host_and_device():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 3, 17, 19, generator=g) * 1.2 - 0.1
    # exact rounding edges of x * 255 + 0.5, and every non-finite kind
    edges = torch.tensor([0.0, 1.0, 0.5 / 255, 1.5 / 255, 254.5 / 255, 127.5 / 255, float("nan"), float("inf"),
                          float("-inf"), -0.0])
    x[0, 0, 0, : edges.numel()] = edges
    x[2] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        u8, finite = to_uint8_torch(xd)
        host = xd.permute(0, 2, 3, 1).float().numpy()  # what diffusers' pt_to_numpy gives
        for i in range(3):
            assert np.array_equal(u8[i].numpy(), to_uint8(host[i]))
        assert finite.tolist() == [bool(np.isfinite(host[i]).all()) for i in range(3)] == [False, True, False]


@pytest.fixture(scope="module")
def sana():
    cfg, fam, pipe = tiny_pipeline("sana_tiny", "sampling.height=64", "sampling.width=64", "sampling.steps=2")
    padder = get_padder("sana", buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    return cfg, fam, pipe, padder


@pytest.mark.parametrize("preset", ["sana_tiny", "flux_tiny"])
def test_staged_denoise_and_decode_equal_the_pipeline_call(preset):
    """SANA decodes in its own stage ("latent"); Flux lets the pipeline decode ("pt")."""
    cfg, fam, pipe = tiny_pipeline(preset)
    with torch.inference_mode():
        text = fam.encode(pipe, ["a red kite over green hills", "snow"], cfg.model, "cpu", instruction=True)
        neg = fam.encode(pipe, ["", ""], cfg.model, "cpu", instruction=False) if preset == "sana_tiny" else None
        req = DenoiseRequest(positive=text, negative=neg, seeds=[3, 4], height=64, width=64, steps=2,
                             guidance_scale=4.5)
        serial = fam.denoise_decode(pipe, req)
        staged, finite = to_uint8_torch(fam.decode(pipe, fam.denoise(pipe, req), req))
    assert fam.denoise_output == ("latent" if preset == "sana_tiny" else "pt")
    for i in range(2):
        assert np.array_equal(staged[i].numpy(), to_uint8(serial[i]))
    assert finite.tolist() == [True, True]


def _run(engine, batches, overlap, stop=lambda: False):
    return list(StageScheduler(engine, CaptureDispatcher(None, engine.cfg.bcg), overlap=overlap).run(batches, stop))


def test_overlapped_stages_give_the_serial_bytes_in_plan_order(sana):
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    batches = [Batch(SIG, items(2, 0), 2), Batch(SIG, items(1, 2), 2), Batch(SIG, items(2, 3), 2)]
    serial = [engine.generate(b) for b in batches]
    overlapped = _run(engine, batches, overlap=True)  # a prefetch thread encodes ahead
    assert [r.items for r in overlapped] == [b.items for b in batches]
    for a, b in zip(serial, overlapped):
        assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images))
        assert a.finite == b.finite and a.batch_size == b.batch_size == 2
        assert set(b.stage_ms) == {"encode", "denoise", "decode"}


def test_stop_starts_nothing_new_and_finishes_what_is_in_flight(sana):
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    batches = [Batch(SIG, items(1, i), 1) for i in range(4)]
    asked = []

    def stop():
        asked.append(1)
        return len(asked) > 2  # stop before the third batch starts

    out = _run(engine, batches, overlap=True, stop=stop)
    assert [r.items[0].key for r in out] == ["k0", "k1"]


def test_an_encode_failure_surfaces_after_the_batch_in_flight_is_handed_on(sana):
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    too_short = Signature(height=64, width=64, text_bucket=2, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")
    batches = [Batch(SIG, items(1, 0), 1), Batch(too_short, items(1, 1, too_short), 1), Batch(SIG, items(1, 2), 1)]
    got = []
    with pytest.raises(AssertionError, match="bucketed it at 2"):  # the plan and the pipeline disagree
        for r in StageScheduler(engine, CaptureDispatcher(None, engine.cfg.bcg), overlap=True).run(batches, lambda: False):
            got.append(r.items[0].key)
    assert got == ["k0"]  # k0 was in flight: it is finished and handed on before the error surfaces


def test_the_job_s_first_batch_is_handed_on_before_the_next_submit(sana):
    """Behind the next submit the first batch would wait a whole batch's time (the submitting thread
    stays a few graph replays ahead of the GPU); later batches overlap as before, across runs too."""
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    events, submit = [], engine.submit
    engine.submit = lambda batch, *a: events.append(("submit", batch.items[0].key)) or submit(batch, *a)
    scheduler = StageScheduler(engine, CaptureDispatcher(None, engine.cfg.bcg), overlap=True)
    for run in ([Batch(SIG, items(1, i), 1) for i in range(3)], [Batch(SIG, items(1, i), 1) for i in (3, 4)]):
        for r in scheduler.run(run, stop=lambda: False):
            events.append(("out", r.items[0].key))
    assert events == [("submit", "k0"), ("out", "k0"), ("submit", "k1"), ("submit", "k2"), ("out", "k1"),
                      ("out", "k2"), ("submit", "k3"), ("submit", "k4"), ("out", "k3"), ("out", "k4")]
    assert scheduler.handed_on == 5


def test_the_batch_after_the_job_s_first_is_timed_alone_as_it_waited_for_that_decode(sana):
    """The capture policy learns a key's eager time from a batch timed since the previous denoise's end.
    The job's first batch is decoded and handed on before the second is submitted, so the second's time
    would hold that decode, which later batches overlap: it is `alone`, as the first is; later ones are not."""
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    dispatcher = CaptureDispatcher(None, engine.cfg.bcg)
    seen, observed = [], dispatcher.observed
    dispatcher.observed = lambda key, mode, ms, alone: seen.append(alone) or observed(key, mode, ms, alone)
    scheduler = StageScheduler(engine, dispatcher, overlap=True)
    for run in ([Batch(SIG, items(1, i), 1) for i in range(4)], [Batch(SIG, items(1, i), 1) for i in (4, 5)]):
        list(scheduler.run(run, stop=lambda: False))
    assert seen == [True, True, False, False, True, False]  # each run's first is alone; the job's second too
    serial = StageScheduler(engine, dispatcher, overlap=False)  # no overlap: every batch waits alike
    seen.clear()
    list(serial.run([Batch(SIG, items(1, i), 1) for i in range(3)], stop=lambda: False))
    assert seen == [True, False, False]


def test_a_new_shape_is_decoded_once_before_its_run_s_first_submit_and_no_sample_changes(sana):
    """warm_decode: before a run's first submit (while its first batch is encoded), random latents of
    that batch's shape are decoded, once per shape over the scheduler's runs; the samples' bytes are
    the serial path's of a pipeline that never warmed."""
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    events, submit, warm = [], engine.submit, engine.warm_decode
    engine.submit = lambda batch, *a: events.append(("submit", batch.items[0].key)) or submit(batch, *a)
    engine.warm_decode = lambda batch: events.append(("warm", batch.size, warm(batch))) or False
    scheduler = StageScheduler(engine, CaptureDispatcher(None, engine.cfg.bcg), overlap=True)
    runs = [[Batch(SIG, items(2, 0), 2), Batch(SIG, items(2, 2), 2)], [Batch(SIG, items(1, 4), 1)],
            [Batch(SIG, items(2, 5), 2)]]
    got = [r for run in runs for r in scheduler.run(run, stop=lambda: False)]
    assert events == [("warm", 2, True), ("submit", "k0"), ("submit", "k2"), ("warm", 1, True), ("submit", "k4"),
                      ("warm", 2, False), ("submit", "k5")]
    fresh = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    serial = [fresh.generate(b) for run in runs for b in run]
    for a, b in zip(serial, got):
        assert a.items == b.items and a.latent_sha256 == b.latent_sha256
        assert all(np.array_equal(x, y) for x, y in zip(a.images, b.images))


def test_batches_left_count_each_size_within_its_run():
    other = Signature(height=128, width=128, text_bucket=64, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")
    sizes = [(SIG, 8), (SIG, 8), (SIG, 8), (SIG, 4), (SIG, 1), (other, 8), (other, 2)]
    batches = [Batch(s, items(1), n) for s, n in sizes]
    assert batches_left_in_run(batches) == [3, 2, 1, 1, 1, 1, 1]


def test_policy_measures_first_then_captures_only_long_runs():
    p = CapturePolicy(prior_ratio=0.9, warmup_iters=2, capture_fixed_ms=100)
    long_key, tail_key = (SIG, 8), (SIG, 1)
    assert not p.wants_capture(long_key, steps=20, batches_left=40)  # nothing measured: run eager
    assert p.needs_measurement(long_key)
    p.observe(long_key, "eager", 1000.0)
    # 39 batches x 1000 ms x 10% = 3900 ms saved > 2 x 50 ms + 100 ms
    assert p.wants_capture(long_key, steps=20, batches_left=39)
    assert not p.wants_capture(tail_key, steps=20, batches_left=1)  # first batch of a key: measure
    p.observe(tail_key, "eager", 200.0)
    assert not p.wants_capture(tail_key, steps=20, batches_left=1)  # 20 ms saving < 2 x 10 + 100 ms
    assert {r["batch"]: r["decision"] for r in p.report()} == {8: "captured", 1: "eager"}


def test_live_warmups_leave_the_capture_cost_to_the_capture_alone():
    """bcg.warmup=live: the warm-ups are the key's own calls, so a capture costs no extra forwards
    and a short run may pay for it where extra forwards would not."""
    for live, wants in ((False, False), (True, True)):
        p = CapturePolicy(prior_ratio=0.9, warmup_iters=2, live_warmup=live, capture_fixed_ms=100)
        key = (SIG, 8)
        p.observe(key, "eager", 2000.0)
        # 1 batch x 2000 ms x 10% = 200 ms saved; cost 2 x 100 ms + 100 ms random, 100 ms live
        assert p.wants_capture(key, steps=20, batches_left=1) is wants, live
        p.observe_capture(key, steps=20, seconds=0.3)  # what the capture took, warm-ups and all
        assert p.capture_fixed_ms == (300.0 if live else 100.0), live


def test_policy_releases_graphs_when_replay_does_not_pay_and_learns_the_ratio():
    p = CapturePolicy(prior_ratio=0.9, min_gain=0.02)
    key = (SIG, 8)
    p.observe(key, "eager", 1000.0)
    assert p.wants_capture(key, steps=20, batches_left=50)
    assert not p.observe(key, "replay", 1300.0)  # the capturing batch: its time includes the capture
    assert p.observe(key, "replay", 995.0)  # 0.5% faster: not worth graphs, release
    assert not p.wants_capture(key, steps=20, batches_left=48)
    # A new key at the same size and batch now expects ~0.5% saving: a 10-batch run is not captured.
    other = (Signature(64, 64, 128, 2, 4.5, True, "float32"), 8)
    p.observe(other, "eager", 1000.0)
    assert not p.wants_capture(other, steps=20, batches_left=10)


def test_a_batch_that_ran_alone_is_not_the_eager_measurement():
    """The run's first batch has no previous batch to be timed from, and denoises without a decode
    beside it; the batches after it share the GPU with one. Its time must not stand for eager, or
    replay (beside a decode) looks slower than it is: the H200 job once released every key's graphs
    this way."""
    p = CapturePolicy(prior_ratio=0.9, min_gain=0.02)
    key = (SIG, 8)
    p.observe(key, "eager", 2250.0, alone=True)
    assert p.needs_measurement(key) and not p.wants_capture(key, steps=20, batches_left=58)
    p.observe(key, "eager", 2500.0)  # beside a decode, like every later batch
    assert p.wants_capture(key, steps=20, batches_left=57)
    p.observe(key, "replay", 2700.0)  # the capturing batch
    assert not p.observe(key, "replay", 2404.0)  # 3.8% under 2500: the graphs stay
    assert {r["batch"]: (r["decision"], r["eager_ms"], r["batches"]) for r in p.report()} == {8: ("captured", 2500.0, 4)}


class _Recording(CaptureDispatcher):
    """The real dispatcher, keeping what the scheduler told it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen: list = []

    def observed(self, key, mode, denoise_ms, alone):
        self.seen.append((denoise_ms, alone))
        super().observed(key, mode, denoise_ms, alone)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_batch_is_timed_from_the_previous_batch_s_denoise_end(sana, overlap):
    """What a batch costs the run: from the previous batch's denoise end to its own, so the host's
    gaps between denoises (launching the decode, collecting pixels, encoding in series) count
    as they do in the job's throughput. A denoise span alone favoured eager on the H200. Overlapped, the
    job's first batch is handed on before the second is submitted, so the second is alone too."""
    cfg, fam, pipe, padder = sana
    engine = Pipeline(cfg, fam, pipe, padder, None, "cpu")
    batches = [Batch(SIG, items(1, i), 1) for i in range(4)]
    subs, submit = [], engine.submit
    engine.submit = lambda *a: subs.append(submit(*a)) or subs[-1]
    dispatcher = _Recording(None, engine.cfg.bcg)
    assert len(list(StageScheduler(engine, dispatcher, overlap=overlap).run(batches, stop=lambda: False))) == 4
    ends = [s.timer.last_end("denoise") for s in subs]
    alone = (0, 1) if overlap else (0,)
    for k in alone:
        assert dispatcher.seen[k] == (pytest.approx(subs[k].timer.ms("denoise")), True)
    for k in range(len(alone), 4):
        ms, alone = dispatcher.seen[k]
        assert not alone and ms == pytest.approx((ends[k] - ends[k - 1]) * 1e3)
        assert ms > subs[k].timer.ms("denoise")  # more than its span: the stages between count


def test_policy_always_captures_every_capturable_key():
    p = CapturePolicy(mode="always")
    assert p.wants_capture((SIG, 1), steps=20, batches_left=1)
