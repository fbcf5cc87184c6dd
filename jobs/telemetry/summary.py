"""What a job did, for a person (the closing log block) and for machines (summary.json)."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from jobs.telemetry.startup import STARTUP_PART_ORDER

STAGE_ORDER = ("startup", "dataset", "plan", "load", "batch_sizing", "generate", "sink_wait", "sink_close")
DEVICE_STAGE_ORDER = ("encode", "denoise", "decode")
LOAD_PART_ORDER = ("imports", "weights", "to_device", "runner", "decoder_fusions")  # jobs/worker/loop.py's _load


def load_parts_text(seconds: Dict[str, float], unit: str = "s") -> str:
    """" (imports 6.1s, weights 0.5s, to_device 1.4s)": the load stage's parts in the order they run."""
    return parts_text(seconds, LOAD_PART_ORDER, unit)


def parts_text(seconds: Dict[str, float], order_of: Tuple[str, ...], unit: str = "s") -> str:
    """" (a 6.1s, b 0.5s)": a stage's parts in the order `order_of` names them, those under 0.05 s (the
    runner's wrap, usually) left out; "" when none is left."""
    shown = [f"{k} {v:.1f}{unit}" for k, v in in_order(seconds, order_of) if v >= 0.05]
    return f" ({', '.join(shown)})" if shown else ""


def device_text(ms: Dict[str, float]) -> str:
    """"encode 0.5s, denoise 3.4s, decode 0.3s": device milliseconds by stage, in the order the stages run."""
    return ", ".join(f"{k} {v / 1e3:.1f}s" for k, v in in_order(ms, DEVICE_STAGE_ORDER))


def in_order(values: Dict[str, float], order_of: Tuple[str, ...]) -> List[Tuple[str, float]]:
    """`values`' items in the order `order_of` names their keys, any other key after them, by name."""
    order = {k: i for i, k in enumerate(order_of)}
    return sorted(values.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))


class StageTimer:
    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


@dataclass
class JobStats:
    status: str = "running"  # running | complete | interrupted | preempted | failed
    items_planned: int = 0  # this part's: the items of the units it leased, less their committed keys
    plan_items: int = 0  # the whole plan's items (every unit, done or not): the same for every part
    items_written: int = 0
    items_skipped_done: int = 0  # already committed by an earlier run
    bad_rows: int = 0
    truncated_prompts: int = 0
    nonfinite_keys: List[str] = field(default_factory=list)
    oom_splits: int = 0
    # dummy rows in the batches cut from the leased units: one batch shape pads a signature's short
    # tail (bcg.pad_short_batches), and every stage runs them; what the contract's default costs a job
    padding_rows: int = 0
    modes: Counter = field(default_factory=Counter)  # replay / eager / mixed, per item
    kinds: Counter = field(default_factory=Counter)  # image / video, per item written (`sample_kind`)
    signatures: Dict[str, int] = field(default_factory=dict)
    stage_seconds: Dict[str, float] = field(default_factory=dict)
    # the load stage's parts (jobs/worker/loop.py): imports, weights, to_device, runner, decoder_fusions
    load_seconds: Dict[str, float] = field(default_factory=dict)
    # the start-up's parts, process start to the plan (jobs/telemetry/startup.py): {} where the front door
    # did not start this process; their sum is stage_seconds' "startup"
    startup_seconds: Dict[str, float] = field(default_factory=dict)
    first_batch_s: Optional[float] = None  # process start to the first batch handed to the sink
    # that batch's device time by stage: what of its wait was the device's (a run's first batch also sets
    # up kernels, captures graphs and checks fused kernels on first sight)
    first_batch_ms: Dict[str, float] = field(default_factory=dict)
    graph: dict = field(default_factory=dict)
    sink: dict = field(default_factory=dict)
    shards: int = 0
    overlap: bool = False  # text encoding and decoding overlapped denoising (job.overlap)
    gpu_stage_ms: Dict[str, float] = field(default_factory=dict)  # device time: encode, denoise, decode
    gpu_busy: Optional[float] = None  # fraction of the generate stage with a kernel running (NVML)
    capture_policy: List[dict] = field(default_factory=list)  # per (signature, batch): decision, ms
    batching: dict = field(default_factory=dict)  # the pool used and how it was chosen (jobs/worker/batch_sizer.py)
    invariant: dict = field(default_factory=dict)  # bcg.invariant: enabled, devices, kernel calls (bcg/invariant)
    flops: dict = field(default_factory=dict)  # model FLOPs per image, TFLOP/s, peak fraction (jobs/models/flops/)
    # a pipeline's per-batch warning (reason -> batches it was said on), logged once (library_warnings.py)
    library_warnings: Dict[str, int] = field(default_factory=dict)
    device: str = ""
    model: str = ""
    output_dir: str = ""
    started: str = ""  # UTC ISO 8601 (jobs/provenance.py now_iso): when this job began, and ended
    ended: str = ""

    def images_per_s(self) -> float:
        """Items written per second of the generate stage (images, or videos: whatever was written)."""
        gen = self.stage_seconds.get("generate", 0.0)
        return self.items_written / gen if gen > 0 else 0.0

    def noun(self) -> str:
        """What was written, for a person: "images", "videos", or "samples" (both, or none yet)."""
        kinds = [k for k, n in self.kinds.items() if n]
        return f"{kinds[0]}s" if len(kinds) == 1 else "samples"

    def written(self) -> str:
        """"3 videos written", "5 samples written (4 images, 1 video)"."""
        text = f"{self.items_written} {self.noun()} written"
        if len([n for n in self.kinds.values() if n]) > 1:
            counts = (f"{n} {k}{'s' if n != 1 else ''}" for k, n in sorted(self.kinds.items()) if n)
            text += " (" + ", ".join(counts) + ")"
        return text

    def to_json(self) -> dict:
        d = asdict(self)
        d["modes"] = dict(self.modes)
        d["kinds"] = dict(self.kinds)
        d["nonfinite"] = len(self.nonfinite_keys)
        d["images_per_s"] = round(self.images_per_s(), 3)
        d["stage_seconds"] = {k: round(v, 3) for k, v in self.stage_seconds.items()}
        return d

    def write(self, output_dir: Path, name: str = "summary.json") -> Path:
        from sinks.atomic import atomic_write_bytes

        path = Path(output_dir) / name
        atomic_write_bytes(path, (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode())
        return path

    def lines(self) -> List[str]:
        g = self.graph
        stages = ", ".join(f"{k} {v:.1f}s" + self._parts(k) for k, v in in_order(self.stage_seconds, STAGE_ORDER))
        # Of the plan's items, not of the leased units': a stopped job has not leased them all.
        planned = self.plan_items or self.items_planned
        generated = self.stage_seconds.get("generate", 0.0) > 0
        rate = (f"{self.images_per_s():.2f} {self.noun()}/s while generating" if generated
                else "nothing generated in this run")
        if self.first_batch_s is not None:
            rate += f"; first batch {self.first_batch_s:.1f}s after the process started"
            if self.first_batch_ms:
                rate += f" (its device time: {device_text(self.first_batch_ms)})"
        out = [
            f"bcgen {self.status}: {self.written()} of {planned} planned "
            f"({self.items_skipped_done} already done) -> {self.output_dir}",
            f"  model {self.model} on {self.device or '-'}; {rate}",
            f"  stages: {stages}",
            f"  signatures: {len(self.signatures)}; items by mode: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.modes.items())),
            "  device time: " + (device_text(self.gpu_stage_ms) or "-")
            + (f"; GPU busy {self.gpu_busy:.0%} while generating" if self.gpu_busy is not None else "")
            + ("; stages overlapped" if self.overlap else ""),
            f"  graphs: {g.get('mode', 'eager')}, hits {g.get('hits', 0)}, misses {g.get('misses', 0)}, "
            f"declined by the capture policy {g.get('declined', 0)}, "
            f"captures {g.get('captures', 0)} ({g.get('capture_seconds', 0.0):.1f}s"
            + (f", after {g['warmups']} eager warm-up calls" if g.get("warmups") else "") + "), "
            f"segments {g.get('segments', 0)}, capture failures {g.get('capture_failures', 0)}"
            + (f", prompt state reused {g['memo_reuses']} / made {g['memo_runs']} times on replay"
               if g.get("memo_reuses") or g.get("memo_runs") else ""),
            self._batching_line(),
            *self._padding_hint(),
            *self._invariant_line(),
            self._flops_line(),
            f"  shards: {self.shards} committed this run; bad rows {self.bad_rows}; truncated prompts "
            f"{self.truncated_prompts}; NaN/Inf images {len(self.nonfinite_keys)}; OOM splits {self.oom_splits}",
        ]
        out += [f"  said once, on {n} batch{'es' if n != 1 else ''} in all: {reason}"
                for reason, n in sorted(self.library_warnings.items())]
        return out

    def _parts(self, stage: str) -> str:
        if stage == "load":
            return load_parts_text(self.load_seconds)
        return parts_text(self.startup_seconds, STARTUP_PART_ORDER) if stage == "startup" else ""

    def _flops_line(self) -> str:
        f = self.flops
        if not f.get("counted") or not f.get("flops_per_image"):
            return "  model FLOPs: " + (f.get("reason") or "not counted")
        # tflops is rounded to 2 places: a tiny model on a CPU reads 0.0, counted all the same
        tflops = f.get("tflops")
        rate = "" if tflops is None else f", {tflops:.1f} TFLOP/s while generating" if tflops else \
            ", under 0.01 TFLOP/s while generating"
        peak = f" = {f['peak_fraction']:.0%} of the GPU's dense bf16 peak ({f['peak_tflops']:g})" \
            if f.get("peak_fraction") else ""
        return f"  model FLOPs: {f['flops_per_image']:.3g} a sample{rate}{peak}"

    def _batching_line(self) -> str:
        b = self.batching
        if not b:
            return "  batch sizes: -"
        grown = f", grown by {b['grown']} in {b['seconds']:.1f}s" if b.get("grown") else ""
        return f"  batch sizes: {b['sizes']} ({b['source']}{grown}; {b['reason']}); {self._padding()}"

    def _invariant_line(self) -> List[str]:
        """With bcg.invariant: where its kernels ran, how many call shapes the vendor kernels (and
        attention's batched call) took (bcg/invariant/verified.py: the canonical bytes either way), and
        the fallbacks, the one place the contract may not hold."""
        inv = self.invariant
        if not inv.get("enabled"):
            return []
        calls = inv.get("calls", {})
        fallbacks = sum(n for op, n in calls.items() if op.endswith(".fallback"))
        fast = inv.get("fast_paths") or {}
        shapes = [f"{fast[k].get('agree', 0)} of {fast[k].get('agree', 0) + fast[k].get('differ', 0)} {name}"
                  for k, name in (("gemm", "GEMM"), ("convolution", "convolution"), ("attention", "attention"))
                  if k in fast]
        parts = [f"on ({', '.join(inv.get('devices', [])) or '-'})"]
        if shapes:
            listed = shapes[0] if len(shapes) == 1 else f"{', '.join(shapes[:-1])} and {shapes[-1]}"
            kept = sum(v.get("kept", 0) for v in fast.values())
            parts.append(f"vendor kernels at {listed} call shapes (the same bytes"
                         + (f"; {kept} verdict{'s' if kept != 1 else ''} kept from earlier runs" if kept else "") + ")")
        parts.append(f"{fallbacks} fallback call{'s' if fallbacks != 1 else ''}"
                     + (" (rows they computed may depend on their batch)" if fallbacks else ""))
        return ["  batch-invariant kernels: " + "; ".join(parts)]

    #: the padding share from which the summary says how to pad nothing (a quarter of the rows run)
    PADDING_HINT_SHARE = 0.25

    def _padding_hint(self) -> List[str]:
        """A line naming the pool that pads nothing, where one batch size padded much: each signature's
        short tail is padded to that size, so a plan of many small signatures (Z-Image's caption
        lengths, many image sizes in one dataset) pads most of its rows."""
        rows = self.items_planned + self.padding_rows
        if not rows or self.padding_rows / rows < self.PADDING_HINT_SHARE:
            return []
        return [f"  padding: {len(self.signatures)} signature(s) for {self.items_planned} items, each short tail "
                f"padded to the batch size; bcg.batch_sizes=[1] pads nothing and keeps one batch shape, at "
                f"batch 1's speed (README: a sample is a function of its row)"]

    def _padding(self) -> str:
        """'16 padding rows of 216 run (7%)': the rows one batch shape adds to short tails, of every
        row the stages ran for this run's items (an OOM split's halves carry their padding along)."""
        if not self.padding_rows:
            return "no padding rows"
        rows = self.items_planned + self.padding_rows
        return f"{self.padding_rows} padding row{'s' if self.padding_rows != 1 else ''} of {rows} run " \
               f"({self.padding_rows / rows:.0%})"
