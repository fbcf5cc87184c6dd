"""Validated rows (as columns) + the job's defaults -> each item's signature, seed and text length.

Columns, not objects: the planner resolves millions of rows, and a frozen dataclass per row costs
more than everything else done to it. A row-level problem (a size the model cannot take, a prompt
too long under model.on_long_prompt=fail) becomes a RowError naming file:line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from jobs.dataset_validate import Record, RowError
from jobs.plan import derive_seed


@dataclass
class ItemDefaults:
    height: int
    width: int
    steps: int
    guidance_scale: float
    negative_prompt: str
    job_seed: int
    dtype: str
    spatial_divisor: int
    on_long_prompt: str  # truncate | fail
    num_frames: int = 1
    fps: float = 16.0
    frames_error: Callable[[int], Optional[str]] = lambda n: None
    """The family's rule: None where it can make `n` frames, else why not and what to use instead."""
    fps_model: str = ""
    """Set (to the pipeline's name) where the model conditions on the frame rate: every item then
    plays at `fps`, since one pipeline call takes one rate; a row asking for another is refused."""
    distilled_model: str = ""
    """Set (to the model's name) where the checkpoint is guidance-distilled: a row asking for
    guidance_scale > 1 is refused (it has no negative branch to guide with)."""


@dataclass
class Rows:
    """Valid dataset rows as columns; None means "use the job's default"."""

    keys: List[str]
    prompts: List[str]
    lines: List[int]
    negatives: List[Optional[str]]
    seeds: List[Optional[int]]
    widths: List[Optional[int]]
    heights: List[Optional[int]]
    steps: List[Optional[int]]
    guidance: List[Optional[float]]
    frames: List[Optional[int]]
    fps: List[Optional[float]]

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> "Rows":
        return cls(keys=[r.key for r in records], prompts=[r.prompt for r in records],
                   lines=[int(r.source.rpartition(":")[2]) for r in records],
                   negatives=[r.negative_prompt for r in records], seeds=[r.seed for r in records],
                   widths=[r.width for r in records], heights=[r.height for r in records],
                   steps=[r.steps for r in records], guidance=[r.guidance_scale for r in records],
                   frames=[r.num_frames for r in records], fps=[r.fps for r in records])


@dataclass
class Resolved:
    """Items as columns, in row order; `sig` is the signature's fields (height, width, text_bucket,
    steps, guidance_scale, cfg, frames): dtype is the job's. fps is the item's, not the signature's:
    it is written into the video, and changes nothing the denoiser sees."""

    keys: List[str] = field(default_factory=list)
    prompts: List[str] = field(default_factory=list)
    negatives: List[str] = field(default_factory=list)
    seeds: List[int] = field(default_factory=list)
    lines: List[int] = field(default_factory=list)
    tokens: List[int] = field(default_factory=list)
    truncated: List[bool] = field(default_factory=list)
    fps: List[float] = field(default_factory=list)
    sig: List[tuple] = field(default_factory=list)


def _lengths(texts: Sequence[str], measure, instruction: bool) -> Dict[str, "object"]:
    """Tokenize each distinct text once."""
    distinct = sorted(set(texts))
    table = {}
    for start in range(0, len(distinct), 8192):
        chunk = distinct[start:start + 8192]
        table.update(zip(chunk, measure(chunk, instruction)))
    return table


def resolve(rows: Rows, defaults: ItemDefaults, measure, bucket_for, label: str) -> Tuple[Resolved, List[RowError]]:
    """`measure(texts, instruction) -> [TextLength]` (the family's text_lengths); `bucket_for(tokens)`."""
    d = defaults.spatial_divisor
    negatives = [defaults.negative_prompt if n is None else n for n in rows.negatives]
    pos_len = _lengths(rows.prompts, measure, True)
    neg_len = _lengths(negatives, measure, False)
    out, errors = Resolved(), []
    fail_long = defaults.on_long_prompt == "fail"
    buckets: Dict[int, int] = {}
    frame_errors: Dict[int, Optional[str]] = {}
    for i, key in enumerate(rows.keys):
        h = rows.heights[i] or defaults.height
        w = rows.widths[i] or defaults.width
        if h % d or w % d:
            errors.append(RowError(label, rows.lines[i], key,
                                   f"size {h}x{w} is not a multiple of {d} (VAE downsampling x patch size); "
                                   f"use e.g. {round(h / d) * d or d}x{round(w / d) * d or d}"))
            continue
        frames = rows.frames[i] or defaults.num_frames
        if frames not in frame_errors:
            frame_errors[frames] = defaults.frames_error(frames)
        if frame_errors[frames] is not None:
            errors.append(RowError(label, rows.lines[i], key, frame_errors[frames]))
            continue
        if defaults.fps_model and rows.fps[i] is not None and float(rows.fps[i]) != defaults.fps:
            errors.append(RowError(label, rows.lines[i], key,
                                   f"fps={rows.fps[i]:g}, but {defaults.fps_model} conditions on the frame rate and "
                                   f"a batch shares one: drop the row's fps (the job's is {defaults.fps:g}) or run "
                                   f"these rows in a job with sampling.fps={rows.fps[i]:g}"))
            continue
        g = rows.guidance[i]
        guidance = defaults.guidance_scale if g is None else float(g)
        cfg = guidance > 1.0
        if cfg and defaults.distilled_model:
            errors.append(RowError(label, rows.lines[i], key,
                                   f"guidance_scale={guidance:g}, but {defaults.distilled_model} is guidance-distilled "
                                   f"(no negative branch); drop the row's guidance_scale or set it to 1.0"))
            continue
        pos = pos_len[rows.prompts[i]]
        if pos.truncated and fail_long:
            errors.append(RowError(label, rows.lines[i], key,
                                   f"prompt has {pos.raw} tokens, more than the model's {pos.limit}; "
                                   f"shorten it or set model.on_long_prompt=truncate"))
            continue
        tokens = max(pos.used, neg_len[negatives[i]].used) if cfg else pos.used
        bucket = buckets.get(tokens)
        if bucket is None:
            bucket = buckets[tokens] = bucket_for(tokens)
        seed = rows.seeds[i]
        out.keys.append(key)
        out.prompts.append(rows.prompts[i])
        out.negatives.append(negatives[i] if cfg else "")
        out.seeds.append(derive_seed(defaults.job_seed, key) if seed is None else seed)
        out.lines.append(rows.lines[i])
        out.tokens.append(tokens)
        out.truncated.append(pos.truncated)
        out.fps.append(defaults.fps if rows.fps[i] is None else rows.fps[i])
        out.sig.append((h, w, bucket, rows.steps[i] or defaults.steps, guidance if cfg else 1.0, cfg, frames))
    return out, errors
