"""The worker's pipeline: one loaded diffusers pipeline, its padder and its graph runner, run as three
stages per batch.

    encode(batch)   prompts -> padded text embeddings      any thread; the encode stream
                    (+ a family's per-row inputs, e.g. GLM-Image's AR prior)
    submit(batch)   denoise -> latents                      the caller's thread; the main stream
                    decode -> uint8 pixels + finite flags   the decode stream, after the denoise
                    pixels, latents -> pinned host memory   non-blocking copy, then an event
    collect(sub)    wait for that event -> BatchResult     numpy arrays for the sink, latent_sha256 per row

`generate(batch)` runs the three in a row (the serial path); jobs/worker/scheduler.py overlaps them so the
next batch's text encoding and this batch's decode run beside denoising. Both give the same
bytes: the stages are the same ops on the same inputs, only their streams differ.

Stream order (why the events): the text is made on the encode stream and read on the main
stream, so the main stream waits on the text's event and the allocator is told the tensors are
used there (`record_stream`), or it could hand their memory to the encode stream's next batch
while the denoiser still reads it. Latents cross from the main to the decode stream the same way.

No host sync after a batch's denoising starts: uint8 conversion and the finite check run on the
device; the host copy is non-blocking into pinned memory; only `collect` waits, on that copy.

`gpu_lock` (the capture dispatcher's lock, jobs/worker/dispatcher.py) is held while a graph is
being captured and while another thread enqueues GPU work: CUDA forbids allocations and syncs from
other threads during a capture (global capture mode). What each batch's denoiser calls may do
(capture, replay, eager) is the dispatcher's decision, passed to `submit`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Tuple, Union, overload

import numpy as np
import torch

from bcg import Dispatch, GraphRunner
from jobs.config import GenerateConfig
from jobs.models.base import DenoiseRequest, ModelFamily, RowInputs
from jobs.plan import Batch, Item, Signature
from jobs.worker.outputs import Generated, HostOutputs, cat, on_device, ran_at, tensors_of
from jobs.worker.samples import item_fps
from padding import Padder, TextEmbeds

log = logging.getLogger(__name__)

Mark = Union[torch.cuda.Event, float]  # where a stage ended: a timing CUDA event, or perf_counter on a CPU


@dataclass
class BatchResult:
    items: List[Item]
    images: List[np.ndarray]  # uint8 [H, W, 3], or [F, H, W, 3] for a video
    finite: List[bool]
    mode: str  # "replay" (every denoiser call replayed a graph), "eager" or "mixed"
    batch_size: int  # the pool batch size the items ran at (halves of it after an OOM split)
    stage_ms: Dict[str, float] = field(default_factory=dict)  # device time of encode/denoise/decode
    audio: List[Optional[np.ndarray]] = field(default_factory=list)  # float32 [N, C] per item (LTX-2), or None
    sample_rate: int = 0  # Hz of `audio`
    meta: List[dict] = field(default_factory=list)  # per-item json fields the family added (GLM-Image's prior)
    latent_sha256: List[str] = field(default_factory=list)  # per item: its denoised latents' digest (outputs.py)


@dataclass
class Encoded:
    """A batch's text on the device, ready for the denoiser once `ready` has been reached."""

    positive: TextEmbeds
    negative: Optional[TextEmbeds]
    ready: Optional[torch.cuda.Event]  # recorded on the encode stream after the last op; None on a CPU
    timer: "StageClock"
    row_inputs: Optional[RowInputs] = None  # the family's per-row inputs beside the text (ModelFamily.row_inputs)


@dataclass
class Submitted:
    """A batch whose pixels are on their way to the host."""

    batch: Batch
    host: HostOutputs  # uint8 pixels [n, H, W, 3] (or [n, F, H, W, 3]), finite flags, audio: host memory
    done: Optional[torch.cuda.Event]  # the copy's completion; None on the CPU (already done)
    mode: str
    batch_size: int
    timer: "StageClock"
    observed: bool = False  # the capture policy has seen its time (jobs/worker/scheduler.py)
    since: Optional[Mark] = None  # the previous batch's denoise end, where this batch's time starts

    @property
    def alone(self) -> bool:
        """No batch before it in this run: no time to give the capture policy (jobs/worker/scheduler.py)."""
        return self.since is None


class StageClock:
    """Device time of one batch's stages: CUDA events on their streams, or the wall clock on a CPU
    (where every op is synchronous). Read only after the batch is done, so reading never waits."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._marks: Dict[str, list] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._marks.setdefault(name, []).append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._marks.setdefault(name, []).append((t0, time.perf_counter()))

    @overload
    def ms(self, name: str, wait: Literal[True]) -> float: ...
    @overload
    def ms(self, name: str, wait: bool = False) -> Optional[float]: ...

    def ms(self, name: str, wait: bool = False) -> Optional[float]:
        """Summed ms of a stage; None while its last event is pending (unless wait=True)."""
        marks = self._marks.get(name)
        if not marks:
            return 0.0
        if not self.cuda:
            return sum(b - a for a, b in marks) * 1e3
        if wait:
            marks[-1][1].synchronize()
        elif not marks[-1][1].query():
            return None
        return sum(a.elapsed_time(b) for a, b in marks)

    def last_end(self, name: str) -> Optional[Mark]:
        """Where the stage's last run ended: a recorded CUDA event, or a perf_counter reading on a CPU."""
        marks = self._marks.get(name)
        return marks[-1][1] if marks else None

    def ms_since(self, since: Mark, name: str, wait: bool = False) -> Optional[float]:
        """ms from `since` (another batch's `last_end`) to the end of this batch's stage; None while
        that end is pending (unless wait=True). Both ends are on the stream the stage runs on."""
        end = self.last_end(name)
        if end is None:
            return None
        if not isinstance(end, torch.cuda.Event) or not isinstance(since, torch.cuda.Event):
            assert isinstance(end, float) and isinstance(since, float)  # a CPU clock: both perf_counter
            return (end - since) * 1e3
        if wait:
            end.synchronize()
        elif not end.query():
            return None
        return since.elapsed_time(end)

    def all_ms(self) -> Dict[str, float]:
        return {k: round(self.ms(k, wait=True), 3) for k in self._marks}


class Pipeline:
    def __init__(self, cfg: GenerateConfig, family: ModelFamily, pipe, padder: Padder,
                 runner: Optional[GraphRunner], device, gpu_lock: Optional[threading.RLock] = None):
        self.cfg, self.family, self.pipe, self.padder, self.runner = cfg, family, pipe, padder, runner
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._negatives: Dict[str, TextEmbeds] = {}  # text -> its native encoding, one row
        self.oom_splits = 0
        self.gpu_lock = gpu_lock if gpu_lock is not None else threading.RLock()
        self.encode_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.decode_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.decoded_shapes: set = set()  # (height, width, frames, rows) decoded so far: warm_decode skips them

    def release_graphs(self) -> None:
        """Free every captured graph (memory for an out-of-memory retry, or a probe's end)."""
        if self.runner is not None:
            self.runner.release_all()

    def _stream(self, stream) -> contextlib.AbstractContextManager:
        """Work on `stream`, on this pipeline's device (a prefetch thread starts on device 0)."""
        if not self.cuda:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(stream))
        return stack

    # -- stage 1: text ---------------------------------------------------------------------
    def encode(self, batch: Batch) -> Encoded:
        """Encode and pad a batch's prompts (dummy rows included). Safe from another thread."""
        items = padded_items(batch)
        sig = batch.signature
        timer = StageClock(self.cuda)
        with self.gpu_lock, torch.inference_mode(), self._stream(self.encode_stream), \
                timer.stage("encode"):
            pos = self.family.encode(self.pipe, [it.prompt for it in items], self.cfg.model, self.device,
                                     instruction=True)
            pos = self._to_bucket(pos, sig.text_bucket, "prompt")
            neg = None
            if sig.cfg:
                neg = self._to_bucket(self._encode_negatives([it.negative_prompt for it in items]),
                                      sig.text_bucket, "negative prompt")
            extra = self.family.row_inputs(self.pipe, [it.prompt for it in items], [it.seed for it in items],
                                           sig.height, sig.width, self.device)
            ready = torch.cuda.Event() if self.cuda else None
            if ready is not None:
                ready.record()
        return Encoded(positive=pos, negative=neg, ready=ready, timer=timer, row_inputs=extra)

    def _encode_negatives(self, texts: List[str]) -> TextEmbeds:
        """The batch's negative prompts, each encoded alone the first time it is seen, then kept (most jobs
        have one). Alone, at one shape: encoded together, a negative's bytes would follow which others
        were new in the same batch (a GEMM's kernel, and so its sums, follow its rows), and a dataset
        with a negative a row would break the one-shape contract (README, a sample is a function of its
        row). A job with one negative encodes it alone either way."""
        missing = sorted({t for t in texts if t not in self._negatives})
        if len(self._negatives) + len(missing) > 4096:  # bound memory on datasets with per-row negatives
            self._negatives.clear()
            missing = sorted(set(texts))
        for t in missing:
            self._negatives[t] = self.family.encode(self.pipe, [t], self.cfg.model, self.device, instruction=False)
        return stack_rows([self._negatives[t] for t in texts])

    def _to_bucket(self, text: TextEmbeds, bucket: int, side: str) -> TextEmbeds:
        used = text.used_length()
        assert used <= bucket, (
            f"{side} text uses {used} positions but the plan bucketed it at {bucket}: the plan's tokenizer "
            f"and the pipeline disagree"
        )
        return self.padder.pad(text, bucket)

    # -- stage 2 + 3: denoise, decode, pixels to the host ----------------------------------
    def submit(self, batch: Batch, enc: Encoded, dispatch: Dispatch = Dispatch.CAPTURE) -> Submitted:
        """Enqueue the batch's denoise, decode and host copy; returns without waiting for them.
        `dispatch`: what its denoiser calls may do (the capture dispatcher's decision)."""
        items = padded_items(batch)
        timer = enc.timer
        with torch.inference_mode():
            if self.cuda:
                main = torch.cuda.current_stream(self.device)
                assert enc.ready is not None  # encode() records it whenever self.cuda
                main.wait_event(enc.ready)  # this batch's text (not the next batch's, enqueued since)
                for t in text_tensors(enc):
                    t.record_stream(main)
            before = self._counts()
            out = self._generate_rows(items, batch.signature, enc.positive, enc.negative, enc.row_inputs, timer,
                                      dispatch)
            mode = self._mode_since(before)
            n = len(batch.items)  # dummy rows are dropped here, before the host copy
            with self._stream(self.decode_stream):
                host, done = out.head(n).to_host(self.cuda)
        return Submitted(batch=batch, host=host, done=done, mode=mode, batch_size=len(items), timer=timer)

    def collect(self, sub: Submitted) -> BatchResult:
        """Wait for a submitted batch's pixels; numpy copies the sink can keep."""
        if sub.done is not None:
            sub.done.synchronize()
        host = sub.host
        pixels = host.pixels.numpy()
        return BatchResult(items=sub.batch.items, images=[pixels[i].copy() for i in range(len(pixels))],
                           finite=[bool(v) for v in host.finite.tolist()], mode=sub.mode,
                           batch_size=sub.batch_size, stage_ms=sub.timer.all_ms(), audio=host.item_audio(),
                           sample_rate=host.sample_rate, meta=host.item_meta(),
                           latent_sha256=host.item_latent_sha256())

    def warm_decode(self, batch: Batch) -> bool:
        """Decode random latents of this batch's shape, outputs thrown away, unless a batch of that shape
        was decoded already or the family offers no latents (ModelFamily.warmup_latents). Returns whether
        it decoded.

        A shape's first decode pays its set-up on the host: cuDNN's plans for each convolution, the
        decoder fusions' first sight (about 1 s at 1024², batch 8, on the H200 by py-spy). Paid after the
        run's first denoise, the GPU waits through it before the first batch is handed on. The scheduler
        calls this while the prefetch thread encodes the run's first batch (the text encoder's own first
        call), so the two set-ups overlap. Call it from the thread that submits: PyTorch keeps cuDNN's
        plans per thread. The job's bytes do not change: no sample's tensor is touched, and the latents
        come from a generator of their own."""
        sig, n = batch.signature, batch.size
        shape = (sig.height, sig.width, sig.frames, n)
        if shape in self.decoded_shapes:
            return False
        self.decoded_shapes.add(shape)
        generator = torch.Generator(self.device).manual_seed(0)
        try:
            with torch.inference_mode(), self._stream(self.decode_stream):
                latents = self.family.warmup_latents(self.pipe, n, sig.height, sig.width, sig.frames,
                                                     self.device, generator)
                if latents is None:
                    return False
                blank = TextEmbeds(embeds=latents.new_zeros((n, 1, 1)), mask=None)
                request = DenoiseRequest(positive=blank, negative=None, seeds=[0] * n, height=sig.height,
                                         width=sig.width, steps=sig.steps, guidance_scale=sig.guidance_scale,
                                         num_frames=sig.frames)
                self.family.decode(self.pipe, latents, request)
        except torch.OutOfMemoryError:
            # The batch may still be made: its own decode splits it on OOM (_generate_rows). So the
            # warm-up gives way, and the first real decode pays the set-up.
            log.info("decode warm-up at %d rows of %dx%d ran out of GPU memory: skipped", n, sig.width, sig.height)
            if self.cuda:
                torch.cuda.empty_cache()
            return False
        return True

    def generate(self, batch: Batch, dispatch: Dispatch = Dispatch.CAPTURE) -> BatchResult:
        """The serial path: encode, submit, collect."""
        return self.collect(self.submit(batch, self.encode(batch), dispatch))

    def _generate_rows(self, items: List[Item], sig: Signature, pos: TextEmbeds, neg: Optional[TextEmbeds],
                       extra: Optional[RowInputs], timer: StageClock, dispatch: Dispatch,
                       retried: bool = False) -> Generated:
        try:
            return self._run(items, sig, pos, neg, extra, timer, dispatch)
        except torch.OutOfMemoryError:
            self.release_graphs()
            if self.cuda:
                torch.cuda.empty_cache()
            if not retried:
                # Once more at the same shape first, eager, with the graphs' pools and the allocator's cache
                # given back: a failure is often memory held there, not needed, and at its own shape the
                # batch keeps its bytes (eager's equal a replay's); a split's rows would follow the halves'.
                log.warning("out of GPU memory at batch %d (%s): graphs released, trying that shape once more, "
                            "eager", len(items), sig)
                return self._generate_rows(items, sig, pos, neg, extra, timer, Dispatch.EAGER, retried=True)
            if len(items) == 1:
                raise
            # Halves run at other batch sizes (eager unless captured), so their rows' bytes follow the
            # halves' shapes: the summary counts the split, and each row's json gives its half's size.
            self.oom_splits += 1
            log.warning("out of GPU memory at batch %d (%s) again: splitting into %d + %d and retrying",
                        len(items), sig, len(items) // 2, len(items) - len(items) // 2)
            h, n = len(items) // 2, len(items)
            a = ran_at(self._generate_rows(items[:h], sig, rows(pos, 0, h), neg and rows(neg, 0, h),
                                           extra and extra.rows(0, h), timer, dispatch), h)
            b = ran_at(self._generate_rows(items[h:], sig, rows(pos, h, n), neg and rows(neg, h, n),
                                           extra and extra.rows(h, n), timer, dispatch), n - h)
            with self._stream(self.decode_stream):
                return cat(a, b)

    def _run(self, items: List[Item], sig: Signature, pos: TextEmbeds, neg: Optional[TextEmbeds],
             extra: Optional[RowInputs], timer: StageClock, dispatch: Dispatch) -> Generated:
        request = DenoiseRequest(positive=pos, negative=neg, seeds=[it.seed for it in items],
                                 height=sig.height, width=sig.width, steps=sig.steps,
                                 guidance_scale=sig.guidance_scale, num_frames=sig.frames,
                                 fps=batch_fps(items, self.family.fps_conditions), prompts=[it.prompt for it in items],
                                 row_inputs=extra, meta=list(extra.meta) if extra is not None else [])
        # One pipeline call: its prompt embeddings (inference tensors) stay as they are through
        # every step, so the graphs' memo breaks (SANA's prompt K/V) may keep what they made; every
        # denoiser call in it follows the dispatcher's decision.
        scope = self.runner.call_scope(dispatch) if self.runner is not None else contextlib.nullcontext()
        with timer.stage("denoise"), scope:
            latents = self.family.denoise(self.pipe, request)
        if self.cuda:
            decode_stream = self.decode_stream
            assert decode_stream is not None  # __init__ makes it whenever self.cuda
            decode_stream.wait_stream(torch.cuda.current_stream(self.device))
            for t in tensors_of(latents):
                t.record_stream(decode_stream)
        # The decode overlaps the next batch's denoise: it runs on its own stream. The latents go on
        # with the pixels, to be hashed on the host (latent_sha256): decoding reads them, never writes.
        self.decoded_shapes.add((sig.height, sig.width, sig.frames, len(items)))
        with self._stream(self.decode_stream), timer.stage("decode"):
            return on_device(self.family.decode(self.pipe, latents, request), request.meta, latents)

    def _counts(self) -> Tuple[int, int]:
        if self.runner is None:
            return (0, 0)
        c = self.runner.counters
        return (c.hits, c.misses + c.declined)

    def _mode_since(self, before: Tuple[int, int]) -> str:
        hits, eager = (a - b for a, b in zip(self._counts(), before))
        if hits and not eager:
            return "replay"
        return "mixed" if hits else "eager"


def padded_items(batch: Batch) -> List[Item]:
    return list(batch.items) + [batch.items[-1]] * batch.n_dummy  # dummy rows: discarded after decode


def batch_fps(items: List[Item], conditions: bool) -> float:
    """The batch's frame rate. Where the model conditions on it, the plan gave every item the job's
    rate (jobs/plan/resolve.py), so the batch has one."""
    rates = {item_fps(it) for it in items}
    assert not conditions or len(rates) == 1, f"one batch, several frame rates {sorted(rates)}: the plan must refuse"
    return item_fps(items[0])


def text_tensors(enc: Encoded) -> List[torch.Tensor]:
    out = []
    for text in (enc.positive, enc.negative):
        if text is not None:
            out += [text.embeds] + ([text.mask] if text.mask is not None else []) + list(text.extras.values())
    if enc.row_inputs is not None:
        out += list(enc.row_inputs.tensors.values())
    return out


def rows(text: TextEmbeds, a: int, b: int) -> TextEmbeds:
    """Rows a..b of a batch; extras are batch-first tensors (e.g. Flux's pooled embedding)."""
    return TextEmbeds(embeds=text.embeds[a:b], mask=None if text.mask is None else text.mask[a:b],
                      extras={k: v[a:b] for k, v in text.extras.items()})


def row(text: TextEmbeds, i: int) -> TextEmbeds:
    return rows(text, i, i + 1)


def stack_rows(rows_: List[TextEmbeds]) -> TextEmbeds:
    first = rows_[0]
    return TextEmbeds(embeds=torch.cat([r.embeds for r in rows_]),
                      mask=None if first.mask is None else torch.cat(_masks(rows_)),
                      extras={k: torch.cat([r.extras[k] for r in rows_]) for k in first.extras})


def _masks(rows_: List[TextEmbeds]) -> List[torch.Tensor]:
    """Every row's mask; the rows come from one family's encode, so all have one or none."""
    masks: List[torch.Tensor] = []
    for r in rows_:
        if r.mask is None:
            raise TypeError("stack_rows: text rows with a mask and rows without one")
        masks.append(r.mask)
    return masks
