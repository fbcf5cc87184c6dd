"""The stage scheduler: keep the GPU busy by overlapping text encoding, denoising and decoding.

    prefetch thread   encode(k+1), encode(k+2)   (bounded queue; the encode stream)
    this thread       submit(k): denoise(k) on the main stream, decode(k) on the decode stream
                      collect(k-1): wait for its pixels, hand them on (the sink encodes on threads)

So while batch k denoises, batch k+1's text is encoded and batch k-1 is decoded and copied to
the host. While a run's first batch is encoded, this thread decodes random latents of that batch's
shape if none was decoded yet (`Pipeline.warm_decode`), so the decoder's first-call set-up is not paid
between the first denoise and the first hand-off. The job's first batch alone is collected before the
next submit, so the first samples reach the sink a batch sooner (`_depth`). The scheduling lives here,
once, for every family; families only provide the stages (jobs/models/base.py). With `overlap` off, or
on a CPU by default, the same loop runs the stages one after another in this thread: the bytes are the
same either way (tests/test_stages.py).

The scheduler asks the capture dispatcher (jobs/worker/dispatcher.py) before each batch, because
only the scheduler knows the plan's order: how many batches of a key (signature, batch size) are
left in its run, when a signature's sorted run ends (its graphs are then released), and when a
batch's time is known (the dispatcher learns from it): from the previous batch's denoise end to its own
on the main stream, so the time a batch costs the run, with its host gaps and the other stages' share
of the GPU in it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Callable, Deque, Generator, List, Sequence

from bcg import Dispatch
from jobs.plan import Batch
from jobs.worker.dispatcher import CaptureDispatcher
from jobs.worker.pipeline import BatchResult, Pipeline, Submitted

log = logging.getLogger(__name__)

_END = object()


def batches_left_in_run(batches: Sequence[Batch]) -> List[int]:
    """For each batch, how many batches of its (signature, size) remain in its run, itself included."""
    left = [0] * len(batches)
    counts: dict = {}
    for i in range(len(batches) - 1, -1, -1):
        b = batches[i]
        if i + 1 < len(batches) and batches[i + 1].signature != b.signature:
            counts = {}  # a new run starts after this batch
        counts[b.size] = counts.get(b.size, 0) + 1
        left[i] = counts[b.size]
    return left


class Prefetcher:
    """Encodes batches ahead on a thread; errors surface in the consumer, in order."""

    def __init__(self, pipeline: Pipeline, batches: Sequence[Batch], depth: int):
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(pipeline, batches), name="bcgen-encode", daemon=True)
        self._thread.start()

    def _work(self, pipeline: Pipeline, batches: Sequence[Batch]) -> None:
        try:
            for b in batches:
                if self._stop.is_set():
                    return
                self._put((b, pipeline.encode(b)))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer's thread
            self._put(e)
            return
        self._put(_END)

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        while True:
            item = self._q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def inline(pipeline: Pipeline, batches: Sequence[Batch]):
    for b in batches:
        yield b, pipeline.encode(b)


class StageScheduler:
    def __init__(self, pipeline: Pipeline, dispatcher: CaptureDispatcher, overlap: bool, depth: int = 1):
        self.pipeline, self.dispatcher, self.overlap = pipeline, dispatcher, overlap
        self.depth = depth if overlap else 0  # batches in flight beyond the one just submitted
        self.stage_ms: dict = {}
        self.handed_on = 0  # batches handed on so far, over every run of this scheduler

    def run(self, batches: Sequence[Batch], stop: Callable[[], bool]) -> Generator[BatchResult, None, None]:
        """Results in plan order. `stop()` is asked before each new batch: once true, nothing new
        starts, and the batches in flight are finished and yielded (their work is done)."""
        left = batches_left_in_run(batches)
        index = {id(b): i for i, b in enumerate(batches)}
        source = Prefetcher(self.pipeline, batches, depth=2) if self.overlap else inline(self.pipeline, batches)
        flight: Deque[Submitted] = deque()
        current, error, last_end = None, None, None
        try:
            if self.overlap and batches:
                self.pipeline.warm_decode(batches[0])  # a new shape's decode set-up, beside its first encode
            encoded = iter(source)
            while True:
                try:
                    batch, enc = next(encoded)
                except StopIteration:
                    break
                except BaseException as e:  # noqa: BLE001 - an encode failure: finish what is in flight first
                    error = e
                    break
                if stop():
                    break
                if batch.signature != current:
                    if current is not None:
                        self.dispatcher.end_run()  # sorted plan: the previous signature never comes back
                    current = batch.signature
                dispatch = self._decide(batch, left[index[id(batch)]], flight)
                sub = self._submit(batch, enc, dispatch)
                # A batch's time is from the previous batch's denoise end to its own: what it adds to
                # the run, with the GPU shared as every later batch shares it. The run's first batch
                # has no such time (the capture policy's `alone`).
                sub.since, last_end = last_end, sub.timer.last_end("denoise")
                flight.append(sub)
                handed_on_alone = self.depth > 0 and self._depth() == 0  # the job's first batch (`_depth`)
                while len(flight) > self._depth():
                    yield self._collect(flight.popleft())
                if handed_on_alone:
                    # The next batch starts after this one's decode and hand-off: timed from this denoise's
                    # end it would carry that decode, which later batches overlap. So it is `alone` too.
                    last_end = None
            while flight:  # their work is done: hand it on, so the sink can commit it
                yield self._collect(flight.popleft())
        finally:
            if isinstance(source, Prefetcher):
                source.close()
        if error is not None:
            raise error

    def _depth(self) -> int:
        """Batches left in flight after a submit. The job's first batch is handed on as soon as it is
        decoded: behind the next submit it would wait a whole batch's time, since this thread stays
        only a few graph replays ahead of the GPU while it submits (the H200 job handed its first
        batch on 6.6 s into the generate stage, 2.2 s a batch). Waiting for it leaves the GPU idle
        once, while the next batch's host-side start runs (tens of milliseconds); a user sees the
        first samples a batch sooner."""
        return 0 if self.handed_on == 0 else self.depth

    def _submit(self, batch: Batch, enc, dispatch: Dispatch) -> Submitted:
        before = self.dispatcher.capture_seconds()
        sub = self.pipeline.submit(batch, enc, dispatch)
        spent = self.dispatcher.capture_seconds() - before
        if spent > 0:
            self.dispatcher.captured((batch.signature, batch.size), batch.signature.steps, spent)
        return sub

    def _decide(self, batch: Batch, batches_left: int, flight: Deque[Submitted]) -> Dispatch:
        if self.dispatcher.needs_measurement(batch):
            key = (batch.signature, batch.size)
            for sub in flight:  # its eager time is on its way: wait for that batch's denoise
                if (sub.batch.signature, sub.batch_size) == key:
                    self._observe(sub, wait=True)
        return self.dispatcher.decide(batch, batches_left)

    def _observe(self, sub: Submitted, wait: bool) -> None:
        if sub.observed:
            return
        ms = (sub.timer.ms("denoise", wait=wait) if sub.since is None  # alone
              else sub.timer.ms_since(sub.since, "denoise", wait=wait))
        if ms is None:
            return
        sub.observed = True
        self.dispatcher.observed((sub.batch.signature, sub.batch_size), sub.mode, ms, sub.alone)

    def _collect(self, sub: Submitted) -> BatchResult:
        result = self.pipeline.collect(sub)
        self.handed_on += 1
        self._observe(sub, wait=True)
        for k, v in result.stage_ms.items():
            self.stage_ms[k] = self.stage_ms.get(k, 0.0) + v
        return result
