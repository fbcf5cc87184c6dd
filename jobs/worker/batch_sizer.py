"""Batch size by memory: grow the pool past its largest size while memory allows and it pays.

Small latents leave a GPU half idle at batch 8; large ones fill it. So the pool's largest size is a
start, not a ceiling: at warm-up the worker probes the plan's most common signature at the largest
pool size b and then 2b, 4b, ... up to `bcg.batch_grow_max`, each with the real model on the real
prompts of that signature (eager, output discarded):

    per candidate   warm call at 2 steps (first sight of the shapes: kernel autotune, fused-kernel
                    checks), timed calls at 1 and 3 steps, peak memory of each
    per-image cost  (t1 + (steps - 1) * (t3 - t1) / 2) / b        at the job's real step count
    grow to 2b      if cost(2b) <= (1 - min_gain) * best cost so far and its predicted peak fits
                    (weights + 2 x the activations measured at b, scaled to the plan's largest
                    image, under `memory_fraction` of the device: the rest is for graph pools)

A candidate that runs out of memory ends the search. "Largest that fits" alone would be wrong at
kernel-bound shapes (SANA-1.6B at 512²: batch 16 ran at 0.98x batch 8), hence the cost check.

Off by default (`bcg.batch_grow=off`): probing costs 10-28 s at SANA-1.6B size before the first
image, more than growing saves on jobs of a few thousand images, and the pick it makes is a timing
that changes bytes. `on` (any device) and `auto` (CUDA) probe once per GPU model, software stack,
model and signature: the pick is cached under the user's cache folder (jobs/user_cache.py:
<that>/batching/) and a later job with the same key reuses it without probing.

The pick changes bytes (kernels reduce differently per batch size), so it is made once per
output_dir and published to `_plan/batching.json`: every worker and every resume uses the same
sizes, whichever GPU they run on (with an object-store output_dir the file goes up with the plan
and comes back down on resume, jobs/output/mirror.py). The file carries the run's id and a digest
of itself: one edited by hand, or left by another run, is refused rather than followed. Probes
never capture graphs. With `bcg.invariant` the pick changes no byte: it is each worker's own and
is not published (`choose`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from bcg import Dispatch
from jobs.errors import UserError
from jobs.output.claim import publish_once
from jobs.output.layout import BATCHING_FILE
from jobs.plan import Batch, Item, Signature
from jobs.plan.units import read_unit
from jobs.user_cache import user_cache_dir
from sinks.atomic import atomic_write_bytes

log = logging.getLogger(__name__)



@dataclass
class Probe:
    """One candidate batch size, measured."""

    batch: int
    one_step_ms: float
    two_step_ms: float  # measured as (1 step + 3 steps) / 2: the step time over two steps
    peak_bytes: int  # peak device memory during the probe (0 on a CPU)
    cost_ms: float = 0.0  # per image, at the job's step count

    def per_image_ms(self, steps: int) -> float:
        step = max(self.two_step_ms - self.one_step_ms, 0.0)
        return (self.one_step_ms + (steps - 1) * step) / self.batch


@dataclass
class BatchPick:
    """What was chosen and why (summary.json `batching`)."""

    sizes: List[int]  # the pool to cut units with
    grown: List[int] = field(default_factory=list)  # sizes added past the configured pool
    probes: List[Probe] = field(default_factory=list)
    reason: str = ""
    signature: str = ""
    seconds: float = 0.0  # time spent probing
    source: str = "measured"  # measured | cached | configured | published (another worker or run chose it)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "BatchPick":
        d = {k: v for k, v in d.items() if k not in ("run", "sha256")}
        d["probes"] = [Probe(**p) for p in d.get("probes", [])]
        return cls(**d)


# -- policy: a pure function of measurements ------------------------------------------------------
def grow(pool: Sequence[int], measure: Callable[[int], Optional[Probe]], steps: int, limit: int,
         min_gain: float, fits: Callable[[Probe, int], bool]) -> BatchPick:
    """Double the pool's largest size while the next size fits and costs `min_gain` less per image.

    `measure(b)` probes batch size b (None: it ran out of memory); `fits(probe, b)` predicts from a
    probe whether batch size b would fit.
    """
    sizes = sorted({int(s) for s in pool})
    best = measure(sizes[-1])
    if best is None:
        return BatchPick(sizes=sizes, reason=f"the pool's largest size {sizes[-1]} ran out of memory when probed")
    best.cost_ms = best.per_image_ms(steps)
    probes, grown, b = [best], [], sizes[-1] * 2
    reason = f"next size {b} is over bcg.batch_grow_max={limit}"
    while b <= limit:
        if not fits(probes[-1], b):
            reason = f"batch {b} is predicted not to fit in memory"
            break
        p = measure(b)
        if p is None:
            reason = f"batch {b} ran out of memory"
            break
        p.cost_ms = p.per_image_ms(steps)
        probes.append(p)
        if p.cost_ms > (1.0 - min_gain) * best.cost_ms:
            reason = (f"batch {b} costs {p.cost_ms:.2f} ms/image vs {best.cost_ms:.2f} at {best.batch}: "
                      f"not {min_gain:.0%} cheaper")
            break
        best, b = p, b * 2
        grown.append(best.batch)
        reason = f"next size {b} is over bcg.batch_grow_max={limit}"
    return BatchPick(sizes=sizes + grown, grown=grown, probes=probes, reason=reason)


# -- mechanism: probing with the real pipeline -----------------------------------------------------
def probe_batch(items: Sequence[Item], sig: Signature, size: int, steps: int) -> Batch:
    """A batch of `size` rows of this signature at `steps` steps: the real prompts, repeated as
    dummy rows are when there are fewer than `size`."""
    return Batch(signature=replace(sig, steps=steps), items=list(items[:size]), size=size)


class PipelineProber:
    """Times `pipeline.generate` at n and n + 2 steps for a batch size, eager, and records peak memory;
    n is the family's fewest steps (1, or MiniMax-H3's 2).

    An out-of-memory denoise is split in halves by the pipeline (jobs/worker/pipeline.py) rather than raised:
    the probe then reads slower per image, so the size is not taken either."""

    def __init__(self, pipeline, items: Sequence[Item], sig: Signature):
        self.pipeline, self.items, self.sig = pipeline, list(items), sig
        self.cuda = pipeline.cuda
        self.first = pipeline.family.min_steps

    def __call__(self, size: int) -> Optional[Probe]:
        n = self.first
        try:
            # Warm at n + 1 steps: every shape of a step sequence seen once (kernel autotune, fused-kernel
            # checks); a one-time cost left in a timed call would be multiplied by the step count.
            self._run(size, n + 1)
            ta, ma = self._run(size, n)
            tb, mb = self._run(size, n + 2)
        except torch.OutOfMemoryError:
            self.pipeline.release_graphs()
            torch.cuda.empty_cache()
            log.info("batch sizing: batch %d ran out of memory", size)
            return None
        step = (tb - ta) / 2
        one = ta - (n - 1) * step  # the fixed part (text, decode) plus one step
        p = Probe(batch=size, one_step_ms=one, two_step_ms=one + step, peak_bytes=max(ma, mb))
        log.info("batch sizing: batch %d: %.1f ms at %d step(s), %.1f ms at %d, peak %.2f GiB", size, ta, n, tb,
                 n + 2, p.peak_bytes / 2**30)
        return p

    def _run(self, size: int, steps: int):
        pipeline = self.pipeline
        runner = pipeline.runner
        declined = runner.counters.declined if runner is not None else 0
        splits = pipeline.oom_splits
        if self.cuda:
            torch.cuda.synchronize(pipeline.device)
            torch.cuda.reset_peak_memory_stats(pipeline.device)
        t0 = time.perf_counter()
        try:
            # Probes never capture, and their calls are not the job's: eager, uncounted.
            pipeline.generate(probe_batch(self.items, self.sig, size, steps), Dispatch.EAGER)  # waits for the pixels
        finally:
            if runner is not None:
                runner.counters.declined = declined
            if pipeline.oom_splits != splits:
                log.info("batch sizing: batch %d ran out of memory and was split", size)
            pipeline.oom_splits = splits  # the job's summary counts the job's splits only
        ms = (time.perf_counter() - t0) * 1e3
        peak = torch.cuda.max_memory_allocated(pipeline.device) if self.cuda else 0
        return ms, peak


def memory_fits(device: torch.device, fraction: float, scale: float) -> Callable[[Probe, int], bool]:
    """Predict whether batch b fits from a probe at a smaller batch: weights stay, activations scale
    with the batch and with `scale` (the plan's largest image over the probed one)."""
    if device.type != "cuda":
        return lambda probe, b: True
    weights = torch.cuda.memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory

    def fits(probe: Probe, b: int) -> bool:
        activations = max(probe.peak_bytes - weights, 0) * b / probe.batch * scale
        return weights + activations <= fraction * total

    return fits


# -- publication: one pick per output_dir -------------------------------------------------------
def _sealed(pick: BatchPick, run: str) -> bytes:
    """batching.json's bytes: the pick, the run it was made for, and a digest of both."""
    body = dict(pick.to_json(), run=run)
    body["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def read_published(plan_dir: Path, run: str, lineage: frozenset = frozenset()) -> Optional[BatchPick]:
    """The pick published for run `run` (or one of its earlier ids, `lineage`: job.extend), or None;
    refused if it was edited or is another run's."""
    path = plan_dir / BATCHING_FILE
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
        sealed = body.pop("sha256")
        ok = sealed == hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok or (body.get("run") != run and body.get("run") not in lineage):
        why = "is not the file this run published (edited, or damaged)" if not ok else \
            f"was published for run {body.get('run')!r}, not this one ({run})"
        raise UserError(f"{path} {why}: the run's batches are cut with it, so following it could write batches the "
                        f"run never chose. Restore it (an object store keeps its own copy; a rerun fetches it), or "
                        f"start again in a new output_dir")
    pick = BatchPick.from_json(body)
    pick.source = "published"
    return pick


def publish(plan_dir: Path, pick: BatchPick, run: str,
            on_published: Callable[[Path], None] = lambda path: None) -> BatchPick:
    """Publish `pick` unless another worker did first; returns the one every worker uses.
    `on_published(path)` runs in the worker that published it (an object store's upload)."""
    if publish_once(plan_dir / BATCHING_FILE, _sealed(pick, run)):
        on_published(plan_dir / BATCHING_FILE)
        return pick
    published = read_published(plan_dir, run)
    assert published is not None  # publish_once lost to a file that is there
    return published


# -- a measured pick, cached per machine kind and model ---------------------------------------------
def cache_dir() -> Path:
    return user_cache_dir() / "batching"


def cache_key(identity: dict, sig: Signature, pool: Sequence[int], cfg_bcg, device: torch.device) -> str:
    """Everything a measured pick depends on: the GPU model, the software stack, the model (the
    run identity's model section and quality tier), the signature, the growth settings and the
    kernels (bcg.invariant)."""
    import diffusers

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()}"
    parts = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "diffusers": diffusers.__version__,
             "model": identity.get("model"), "tier": [identity.get("bcg_fusions"), identity.get("bcg_compile")],
             "signature": str(sig), "pool": list(pool), "max": cfg_bcg.batch_grow_max,
             "min_gain": cfg_bcg.batch_grow_min_gain, "memory_fraction": cfg_bcg.batch_grow_memory_fraction}
    if cfg_bcg.invariant_on(device.type):  # other kernels, other timings (named only when on: older keys stay)
        parts["invariant"] = True
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def load_cached(key: str) -> Optional[BatchPick]:
    path = cache_dir() / f"{key}.json"
    try:
        pick = BatchPick.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None  # none yet, or unreadable: measure (and write it anew)
    pick.source = "cached"
    return pick


def save_cached(key: str, pick: BatchPick) -> None:
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache_dir() / f"{key}.json", (json.dumps(pick.to_json(), indent=1) + "\n").encode())
    except OSError as e:  # a cache that cannot be written costs the next job a probe, nothing more
        log.warning("batch sizing: could not cache the pick in %s (%s)", cache_dir(), e)


# -- the worker's entry: published pick, configured pool, or a measurement ------------------------
def choose(cfg, manifest, plan_dir: Path, pipeline, run: str,
           on_published: Callable[[Path], None] = lambda path: None, lineage: frozenset = frozenset()) -> BatchPick:
    """The batch sizes this worker cuts units with (see the module docstring); `run` is the run's
    id (batching.json carries it; `lineage` its earlier ids); `on_published` as for `publish`.

    With `bcg.invariant` the pool changes no byte, so no pick binds another worker or a resume: each
    worker cuts with its own (configured, cached or measured) and publishes nothing, so a rerun
    with another `bcg.batch_sizes` uses that pool rather than the first run's."""
    invariant = cfg.bcg.invariant_on(pipeline.device.type)
    settle = _own if invariant else publish
    if not invariant:
        published = read_published(plan_dir, run, lineage)
        if published is not None:
            return published
    pool, mode = sorted({int(b) for b in cfg.bcg.batch_sizes}), cfg.bcg.batch_grow
    counts: Dict[Signature, int] = {}
    for u in manifest.units:
        counts[u.signature] = counts.get(u.signature, 0) + u.count
    limit = min(cfg.bcg.batch_grow_max, max(counts.values(), default=0))
    if mode == "off" or (mode == "auto" and not pipeline.cuda):
        why = "bcg.batch_grow=off" if mode == "off" else "bcg.batch_grow=auto grows on CUDA only"
        return settle(plan_dir, BatchPick(sizes=pool, reason=why, source="configured"), run, on_published)
    if pool[-1] * 2 > limit:
        return settle(plan_dir, BatchPick(sizes=pool, source="configured",
                                          reason=f"no signature has {pool[-1] * 2} items, "
                                                 f"or bcg.batch_grow_max is lower"),
                      run, on_published)
    sig = max(counts, key=lambda s: (counts[s], s))  # the most common signature: what the job mostly runs
    key = cache_key(manifest.identity, sig, pool, cfg.bcg, pipeline.device)
    pick = load_cached(key)
    if pick is not None:
        log.info("batch sizing on %s: pool %s from the cache (%s; %s)", sig, pick.sizes, cache_dir() / f"{key}.json",
                 pick.reason)
        return settle(plan_dir, pick, run, on_published)
    pick = _measure(cfg, manifest, plan_dir, pipeline, sig, counts, pool, limit)
    save_cached(key, pick)
    return settle(plan_dir, pick, run, on_published)


def _own(plan_dir: Path, pick: BatchPick, run: str, on_published: Callable[[Path], None]) -> BatchPick:
    """`publish`'s stand-in under bcg.invariant: the pick is this worker's alone."""
    return pick


def _measure(cfg, manifest, plan_dir: Path, pipeline, sig: Signature, counts: dict, pool: List[int],
             limit: int) -> BatchPick:
    info = max((u for u in manifest.units if u.signature == sig), key=lambda u: (u.count, -u.id))
    items = read_unit(plan_dir, info, manifest.source_files, cfg.model.dtype)
    pixels = lambda s: s.height * s.width * s.frames  # noqa: E731
    scale = max(pixels(s) for s in counts) / pixels(sig)
    t0 = time.perf_counter()
    pick = grow(pool, PipelineProber(pipeline, items, sig), sig.steps, limit, cfg.bcg.batch_grow_min_gain,
                memory_fits(pipeline.device, cfg.bcg.batch_grow_memory_fraction, scale))
    pick.signature, pick.seconds = str(sig), round(time.perf_counter() - t0, 2)
    log.info("batch sizing on %s took %.1fs: pool %s%s (%s)", sig, pick.seconds, pick.sizes,
             f", grown by {pick.grown}" if pick.grown else "", pick.reason)
    return pick
