"""The capture dispatcher: per (signature, batch size), whether a batch captures, replays or runs
eager — decided here, once, and handed to the graph runner as a `bcg.Dispatch` that it carries out.

    dispatcher.decide(batch, batches_left)  -> Dispatch.CAPTURE | REPLAY | EAGER
    dispatcher.observed(submitted)          the batch's time, when known (may release graphs)
    dispatcher.captured(key, seconds)       a capture's cost, learned
    dispatcher.lock                         held while a graph is captured and while other threads
                                            enqueue GPU work (CUDA forbids both at once)

What may capture at all: the pool's batch sizes at the declared resolutions (`capturable`);
anything else replays what exists or runs eager as a counted miss. Text lengths need no
allow-list: the padder maps every prompt to a finite set of buckets. Among capturable keys, the
policy below (`CapturePolicy`, a pure function of measurements) says whether capturing pays.

With `bcg.capture=auto`, capture only what pays: measure first, then decide. (`always`, the default,
captures every capturable key on its first batch: at SANA-1.6B 512² the measured eager batches cost
the job 10% over the wall clock, README "Speed".)

A capture costs `warmup_iters` extra eager forwards plus the capture itself (with `bcg.warmup=live`,
the job's default, the warm-ups are the key's first calls themselves, so the capture alone); it saves
(eager - replay) on every later call. At kernel-bound shapes (SANA-1.6B at batch 8) replay saves
about 1%, so a short run, or a tail batch of another size, loses time by capturing (ANCHORS.md).

    first batch of a key      run eager, measure its time (useful work: nothing is wasted)
    next batch                capture if  calls_left * eager_call * (1 - replay/eager)  >  capture cost,
                              with replay/eager taken from the nearest key measured so far (or a prior)
    second graphed batch      measure replay (the first one also paid for the capture); if it is not
                              `min_gain` faster than eager, release the graphs and run the rest of the
                              run eager

Only like is compared with like: a batch's time is what it adds to the run, from the previous
batch's denoise end to its own on the main stream (jobs/worker/scheduler.py). Not its denoise alone:
overlapped, a denoise shares the GPU with the previous batch's decode and the next one's encode. Eager,
the host launches slower than the GPU runs, and those stages fill its gaps; replayed, the denoise
runs back to back and they stretch its span. On the H200 at SANA-1.6B size, 512² batch 8, spans
compared an eager 617 ms with a replay 677 ms and released the graphs; the job then ran eager with
its GPU busy 61% of the time (benchmarks/results/job_wall_h200_spy512_s28.md). Earlier, spans also
compared the job's first batch, alone on the GPU at 2250 ms, with replays beside a decode at 2404 ms,
and released every key's graphs. The run's first batch has no previous end, so it is no measurement
(`alone`): the key's next batch is measured. The job's second batch is `alone` too: the job's first is
decoded and handed on before it is submitted, so its time would carry that decode, which later batches
overlap.

Times come from CUDA events (or the wall clock on a CPU), so one decision costs no host sync beyond
waiting for the previous batch's denoise to end, which the next batch's start does anyway.
Every decision is kept with its numbers for summary.json and logged once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from bcg import Dispatch, GraphRunner
from jobs.config import BcgConfig
from jobs.plan import Batch, Signature

log = logging.getLogger(__name__)

Key = Tuple[Signature, int]  # (signature, pool batch size): one captured graph in the runner


@dataclass
class KeyState:
    eager_ms: Optional[float] = None  # ms one eager batch adds to the run (module docstring)
    replay_ms: Optional[float] = None  # ms one replayed batch adds to the run
    state: str = "measuring"  # measuring | captured | eager
    reason: str = ""
    batches: int = 0
    replayed: int = 0  # batches run with graphs on; the first of them also paid for the capture


@dataclass
class CapturePolicy:
    mode: str = "auto"  # auto | always
    warmup_iters: int = 2
    live_warmup: bool = False  # bcg.warmup=live: the warm-ups are real calls, not extra forwards
    prior_ratio: float = 0.9  # replay/eager before anything was measured: captures only long runs
    min_gain: float = 0.02  # replay must be this much faster than eager, or the graphs are released
    capture_fixed_ms: float = 150.0  # capture overhead beyond the warm-up forwards (graph build, sync)
    keys: Dict[Key, KeyState] = field(default_factory=dict)

    def wants_capture(self, key: Key, steps: int, batches_left: int) -> bool:
        """May the batch about to run capture (or replay) a graph? `batches_left` counts this one."""
        st = self.keys.setdefault(key, KeyState())
        if self.mode == "always" or st.state == "captured":
            return True
        if st.state == "eager" or st.eager_ms is None:
            return False  # the first batch of a key is measured eagerly
        call_ms = st.eager_ms / max(steps, 1)
        ratio = self._ratio_near(key)
        saving = batches_left * st.eager_ms * (1.0 - ratio)
        cost = self._warmup_ms(call_ms) + self.capture_fixed_ms
        if saving > cost:
            st.state = "captured"
            st.reason = (f"capture: {batches_left} batch(es) left x {st.eager_ms:.0f} ms x {1 - ratio:.1%} "
                         f"expected saving = {saving:.0f} ms > capture cost {cost:.0f} ms")
        else:
            st.state = "eager"
            st.reason = (f"eager: {batches_left} batch(es) left would save {saving:.0f} ms, "
                         f"less than the capture cost {cost:.0f} ms")
        log.info("bcg policy [%s, batch %d]: %s", key[0], key[1], st.reason)
        return st.state == "captured"

    def observe(self, key: Key, mode: str, denoise_ms: float, alone: bool = False) -> bool:
        """Record a finished batch; True when its graphs should be released (replay did not pay).
        `alone`: the run's first batch, with no previous batch to time it from: its time is its
        denoise alone, not comparable with the others', so not the key's eager time."""
        st = self.keys.setdefault(key, KeyState())
        st.batches += 1
        if mode == "eager" and st.eager_ms is None and not alone:
            st.eager_ms = denoise_ms
        elif mode == "replay" and self.mode == "auto":
            st.replayed += 1
            if st.replayed != 2:  # the first replayed batch's time includes its capture
                return False
            st.replay_ms = denoise_ms
            if st.eager_ms is not None and denoise_ms > st.eager_ms * (1.0 - self.min_gain):
                st.state = "eager"
                st.reason = (f"eager: replay {denoise_ms:.0f} ms is not {self.min_gain:.0%} faster than "
                             f"eager {st.eager_ms:.0f} ms; graphs released")
                log.info("bcg policy [%s, batch %d]: %s", key[0], key[1], st.reason)
                return True
        return False

    def observe_capture(self, key: Key, steps: int, seconds: float) -> None:
        """Learn the capture overhead beyond the warm-up forwards from a real capture."""
        st = self.keys.get(key)
        if st is None or st.eager_ms is None:
            return
        self.capture_fixed_ms = max(0.0, seconds * 1e3 - self._warmup_ms(st.eager_ms / max(steps, 1)))

    def _warmup_ms(self, call_ms: float) -> float:
        """What the warm-ups add to a capture: extra forwards, or nothing when they are live calls."""
        return 0.0 if self.live_warmup else self.warmup_iters * call_ms

    def needs_measurement(self, key: Key) -> bool:
        """True while a decision waits on this key's eager time."""
        st = self.keys.get(key)
        return self.mode == "auto" and st is not None and st.state == "measuring" and st.eager_ms is None

    def _ratio_near(self, key: Key) -> float:
        """replay/eager of the most similar measured key: same size and batch, else same batch."""
        sig, size = key
        best, best_rank = self.prior_ratio, 3
        for (s, b), st in self.keys.items():
            if st.eager_ms is None or st.replay_ms is None:
                continue
            rank = 0 if (s.height, s.width, b) == (sig.height, sig.width, size) else 1 if b == size else 2
            if rank < best_rank:
                best, best_rank = st.replay_ms / st.eager_ms, rank
        return best

    def report(self) -> List[dict]:
        for st in self.keys.values():
            if st.state == "measuring" and st.batches:
                st.state, st.reason = "eager", f"eager: its run ended after {st.batches} measured batch(es)"
        return [{"signature": str(sig), "batch": size, "decision": st.state, "reason": st.reason,
                 "eager_ms": None if st.eager_ms is None else round(st.eager_ms, 2),
                 "replay_ms": None if st.replay_ms is None else round(st.replay_ms, 2), "batches": st.batches}
                for (sig, size), st in self.keys.items()]


class CaptureDispatcher:
    """The one object that decides, per batch, what the graph runner may do (module docstring)."""

    def __init__(self, runner: Optional[GraphRunner], bcg: BcgConfig):
        self.runner = runner
        self.policy = CapturePolicy(mode=bcg.capture, warmup_iters=bcg.warmup_iters,
                                    live_warmup=bcg.warmup == "live", min_gain=bcg.capture_min_gain)
        self.lock = threading.RLock()
        if runner is not None:
            runner.capture_lock = self.lock
        allowed = bcg.warmup_resolutions
        self._resolutions: Optional[Set[Tuple[int, int]]] = {(int(h), int(w)) for h, w in allowed} if allowed else None
        self._sizes: Set[int] = set()
        self.set_pool(bcg.batch_sizes)

    @property
    def active(self) -> bool:
        """A runner that can capture (CUDA, or the test tape): only then are decisions measured."""
        return self.runner is not None and self.runner.backend is not None

    def set_pool(self, sizes: Iterable[int]) -> None:
        """The pool batch sizes: the ones graphs are captured for (batch sizing may grow it)."""
        self._sizes = {int(b) for b in sizes}

    def capturable(self, sig: Signature, batch_size: int) -> bool:
        if self._resolutions is not None and (sig.height, sig.width) not in self._resolutions:
            return False
        return batch_size in self._sizes

    def needs_measurement(self, batch: Batch) -> bool:
        """True while this batch's decision waits on its key's eager time (the scheduler then
        waits for an in-flight batch of the key to finish denoising)."""
        return self.active and self.policy.needs_measurement((batch.signature, batch.size))

    def decide(self, batch: Batch, batches_left: int) -> Dispatch:
        """What this batch's denoiser calls may do; `batches_left` counts it and the rest of its
        key's run."""
        if not self.capturable(batch.signature, batch.size):
            return Dispatch.REPLAY  # never captured: what exists replays, the rest is a counted miss
        if not self.active:
            return Dispatch.CAPTURE  # no backend: the runner runs eager whatever it is told
        key = (batch.signature, batch.size)
        return Dispatch.CAPTURE if self.policy.wants_capture(key, batch.signature.steps, batches_left) \
            else Dispatch.EAGER

    def observed(self, key: Key, mode: str, denoise_ms: float, alone: bool) -> None:
        """A finished batch's denoise time; releases the graphs when replay did not pay."""
        if self.active and self.policy.observe(key, mode, denoise_ms, alone):
            self.end_run()  # replay did not pay: free the graphs, the rest runs eager

    def captured(self, key: Key, steps: int, seconds: float) -> None:
        if self.active:
            self.policy.observe_capture(key, steps, seconds)

    def capture_seconds(self) -> float:
        return self.runner.counters.capture_seconds if self.runner is not None else 0.0

    def end_run(self) -> None:
        """A sorted run of one signature ended (or did not pay): free its graphs."""
        if self.runner is not None:
            self.runner.release_all()

    def report(self) -> List[dict]:
        return self.policy.report() if self.active else []
