"""The engine: one loaded pipeline, its padder and its graph runner, driven over planned batches.

Per batch: encode the prompts (negatives from a cache: most rows share one), re-bucket both sides
to the batch's text bucket, denoise + decode through the family's pipeline (whose transformer
calls are replayed by the bcg runner), and turn the images into uint8 with NaN/Inf flagged.

Graph lifetime follows the sorted plan: `begin_batch` allows capture only for the shapes the config
declares, `end_run()` releases a signature's graphs once its last batch is done.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from jobs.config import GenerateConfig
from jobs.models.base import DenoiseRequest, ModelFamily
from jobs.plan import Batch, Item, Signature
from padding import Padder, TextEmbeds

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    items: List[Item]
    images: List[np.ndarray]  # uint8 [H, W, 3]
    finite: List[bool]
    mode: str  # "replay" (every denoiser call replayed a graph), "eager" or "mixed"
    batch_size: int  # the pool batch size the items ran at (halves of it after an OOM split)


class Engine:
    def __init__(self, cfg: GenerateConfig, family: ModelFamily, pipe, padder: Padder, runner, device):
        self.cfg, self.family, self.pipe, self.padder, self.runner = cfg, family, pipe, padder, runner
        self.device = device
        self._negatives: Dict[str, TextEmbeds] = {}  # text -> its native encoding, one row
        self.oom_splits = 0
        allowed = cfg.bcg.warmup_resolutions
        self._capture_sizes = {(int(h), int(w)) for h, w in allowed} if allowed else None
        self._capture_batches = {int(b) for b in cfg.bcg.batch_sizes}

    # -- graph lifetime --------------------------------------------------------------------
    def capturable(self, sig: Signature, batch_size: int) -> bool:
        """Capture the pool batch sizes at the declared resolutions; anything else runs eager.

        Text lengths need no allow-list: the padder maps every prompt to a finite set of buckets.
        """
        if self._capture_sizes is not None and (sig.height, sig.width) not in self._capture_sizes:
            return False
        return batch_size in self._capture_batches

    def begin_batch(self, batch: Batch) -> None:
        if self.runner is not None:
            self.runner.capture_allowed = self.capturable(batch.signature, batch.size)

    def end_run(self) -> None:
        if self.runner is not None:
            self.runner.release_all()

    # -- text ------------------------------------------------------------------------------
    def _encode_negatives(self, texts: List[str]) -> TextEmbeds:
        missing = sorted({t for t in texts if t not in self._negatives})
        if len(self._negatives) + len(missing) > 4096:  # bound memory on datasets with per-row negatives
            self._negatives.clear()
            missing = sorted(set(texts))
        if missing:
            enc = self.family.encode(self.pipe, missing, self.cfg.model, self.device, instruction=False)
            for i, t in enumerate(missing):
                self._negatives[t] = row(enc, i)
        return stack_rows([self._negatives[t] for t in texts])

    def _to_bucket(self, text: TextEmbeds, bucket: int, side: str) -> TextEmbeds:
        used = text.used_length()
        assert used <= bucket, (
            f"{side} text uses {used} positions but the plan bucketed it at {bucket}: the plan's tokenizer "
            f"and the pipeline disagree"
        )
        return self.padder.pad(text, bucket)

    # -- one batch -------------------------------------------------------------------------
    def generate(self, batch: Batch) -> BatchResult:
        items = list(batch.items) + [batch.items[-1]] * batch.n_dummy  # dummy rows: discarded below
        images, mode = self._generate_rows(items, batch.signature)
        images = images[: len(batch.items)]
        finite = [bool(np.isfinite(im).all()) for im in images]
        u8 = [to_uint8(im) for im in images]
        return BatchResult(items=batch.items, images=u8, finite=finite, mode=mode, batch_size=len(items))

    def _generate_rows(self, items: List[Item], sig: Signature) -> Tuple[List[np.ndarray], str]:
        try:
            return self._run(items, sig)
        except torch.OutOfMemoryError:
            if len(items) == 1:
                raise
            # Halves run at other batch sizes (eager unless captured); the summary counts the split.
            self.oom_splits += 1
            log.warning("out of GPU memory at batch %d (%s): splitting into %d + %d and retrying",
                        len(items), sig, len(items) // 2, len(items) - len(items) // 2)
            self.end_run()
            torch.cuda.empty_cache()
            half = len(items) // 2
            a, mode_a = self._generate_rows(items[:half], sig)
            b, mode_b = self._generate_rows(items[half:], sig)
            return a + b, mode_a if mode_a == mode_b else "mixed"

    def _run(self, items: List[Item], sig: Signature) -> Tuple[List[np.ndarray], str]:
        model = self.cfg.model
        with torch.inference_mode():
            pos = self.family.encode(self.pipe, [it.prompt for it in items], model, self.device, instruction=True)
            pos = self._to_bucket(pos, sig.text_bucket, "prompt")
            neg = None
            if sig.cfg:
                neg = self._to_bucket(self._encode_negatives([it.negative_prompt for it in items]),
                                      sig.text_bucket, "negative prompt")
            before = self._counts()
            request = DenoiseRequest(positive=pos, negative=neg, seeds=[it.seed for it in items],
                                     height=sig.height, width=sig.width, steps=sig.steps,
                                     guidance_scale=sig.guidance_scale)
            images = self.family.denoise_decode(self.pipe, request)
        return list(images), self._mode_since(before)

    def _counts(self) -> Tuple[int, int]:
        if self.runner is None:
            return (0, 0)
        return (self.runner.counters.hits, self.runner.counters.misses)

    def _mode_since(self, before: Tuple[int, int]) -> str:
        hits, misses = (a - b for a, b in zip(self._counts(), before))
        if hits and not misses:
            return "replay"
        return "mixed" if hits else "eager"


def row(text: TextEmbeds, i: int) -> TextEmbeds:
    """Row i of a batch; extras are batch-first tensors (e.g. Flux's pooled embedding)."""
    return TextEmbeds(embeds=text.embeds[i:i + 1], mask=None if text.mask is None else text.mask[i:i + 1],
                      extras={k: v[i:i + 1] for k, v in text.extras.items()})


def stack_rows(rows: List[TextEmbeds]) -> TextEmbeds:
    first = rows[0]
    return TextEmbeds(embeds=torch.cat([r.embeds for r in rows]),
                      mask=None if first.mask is None else torch.cat([r.mask for r in rows]),
                      extras={k: torch.cat([r.extras[k] for r in rows]) for k in first.extras})


def to_uint8(image: np.ndarray) -> np.ndarray:
    """[H, W, 3] float in [0, 1] -> uint8; NaN/Inf become 0 (the item is flagged separately)."""
    clean = np.nan_to_num(image, nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(clean, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is visible; use device=auto or device=cpu")
    return torch.device(name)


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_pipeline(family: ModelFamily, cfg: GenerateConfig, device: torch.device):
    dtype = torch_dtype(cfg.model.dtype)
    t0 = time.perf_counter()
    pipe = family.build_tiny(cfg.model, dtype) if cfg.model.path is None else family.load(cfg.model, dtype)
    pipe = pipe.to(device)
    pipe.set_progress_bar_config(disable=True)  # the job shows one bar of its own
    log.info("loaded %s (%s, %s) on %s in %.1fs", cfg.model.name, family.pipeline_class, cfg.model.dtype, device,
             time.perf_counter() - t0)
    return pipe


def break_policy(names) -> object:
    """model.break_policy is a list in the config ([none], [attention] or module names)."""
    names = list(names)
    return names[0] if len(names) == 1 and names[0] in ("none", "attention") else names


def attach_runner(family: ModelFamily, pipe, cfg: GenerateConfig, device: torch.device) -> Optional[object]:
    """Wrap the transformer with the bcg runner (it steps aside, eager, without CUDA)."""
    bcg = cfg.bcg
    if not bcg.enabled:
        log.info("bcg.enabled=false: every denoiser call runs eager")
        return None
    from bcg import RunnerConfig, apply_graph_runner

    rc = RunnerConfig(
        enabled=True,
        backend=bcg.backend,
        max_entries=bcg.max_graphs,
        max_graph_bytes=int(bcg.max_graph_memory_gb * (1 << 30)),
        debug_check_buffers=bcg.debug_check_buffers,
        compile=bcg.compile,
        break_policy=break_policy(cfg.model.break_policy),
    )
    return apply_graph_runner(family.transformer(pipe), rc)
