"""Validated rows (as columns) + the job's defaults -> each item's signature, seed and text length.

Columns, not objects: the planner resolves millions of rows, so a row is never a Python object
here. Every rule is a NumPy/Arrow expression over a whole chunk; Python runs only per bad row (to
word its message), per distinct value where a policy is a Python callable (the padder's bucket,
the family's frame rule), and for one hash per row (seeds). A row-level problem (a size the model
cannot take, a prompt too long under model.on_long_prompt=fail) becomes a RowError naming
file:line. tests/test_plan_golden.py holds the plans this must keep giving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

import numpy as np

from jobs.dataset.rules import SEED_END, Record, RowError
from jobs.plan import derive_seeds

if TYPE_CHECKING:
    import pyarrow as pa


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
    min_steps: int = 1
    """The fewest steps the family's scheduler takes: a row asking for fewer is refused."""
    model_name: str = ""
    images_per_prompt: int = 1
    """Samples a valid row makes (sampling.images_per_prompt): keys KEY-0 .. KEY-{n-1}."""


@dataclass
class Rows:
    """Valid dataset rows as Arrow columns (a null means "use the job's default"), `lines` as
    NumPy. Keys are complete (derived ones filled in)."""

    keys: "pa.Array"  # string
    prompts: "pa.Array"  # string
    lines: np.ndarray  # int64
    negatives: "pa.Array"  # string
    seeds: "pa.Array"  # int64
    widths: "pa.Array"  # int64
    heights: "pa.Array"  # int64
    steps: "pa.Array"  # int64
    guidance: "pa.Array"  # float64
    frames: "pa.Array"  # int64
    fps: "pa.Array"  # float64
    extra: Optional["pa.Array"] = None  # string: JSON of the row's dataset.keep_fields (None: none kept)

    def __len__(self) -> int:
        return len(self.lines)

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> "Rows":
        import pyarrow as pa

        def col(name, typ, conv=None):
            values = [getattr(r, name) for r in records]
            if conv is not None:
                values = [None if v is None else conv(v) for v in values]
            return pa.array(values, typ)

        return cls(keys=col("key", pa.string()), prompts=col("prompt", pa.string()),
                   lines=np.array([int(r.source.rpartition(":")[2]) for r in records], np.int64),
                   negatives=col("negative_prompt", pa.string()), seeds=col("seed", pa.int64()),
                   widths=col("width", pa.int64()), heights=col("height", pa.int64()),
                   steps=col("steps", pa.int64()), guidance=col("guidance_scale", pa.float64(), float),
                   frames=col("num_frames", pa.int64()), fps=col("fps", pa.float64(), float),
                   extra=col("extra", pa.string()))


# The signature's fields, as resolved columns (dtype is the job's): the order of SIGNATURE_COLUMNS.
SIG_FIELDS = ("height", "width", "text_bucket", "steps", "guidance_scale", "cfg", "frames")


@dataclass
class Resolved:
    """The valid items as columns, in row order. `sig` holds the signature's fields (SIG_FIELDS)
    as NumPy arrays. fps is the item's, not the signature's: it is written into the video, and
    changes nothing the denoiser sees. `key_hash` is a 64-bit hash of the key (for the planner's
    whole-file uniqueness check)."""

    keys: "pa.Array"
    prompts: "pa.Array"
    negatives: "pa.Array"
    seeds: np.ndarray
    lines: np.ndarray
    tokens: np.ndarray
    truncated: np.ndarray
    fps: np.ndarray
    key_hash: np.ndarray
    sig: Tuple[np.ndarray, ...]
    extra: Optional["pa.Array"] = None

    def __len__(self) -> int:
        return len(self.lines)


def _or(a, default) -> np.ndarray:
    """`value or default` per row (null and 0 take the default), as int64."""
    import pyarrow.compute as pc

    v = pc.fill_null(a, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return np.where(v == 0, np.int64(default), v)


def _floats(a, default: float) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.fill_null(a, float(default)).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _valid(a) -> np.ndarray:
    return a.is_valid().to_numpy(zero_copy_only=False)


Measure = Callable[["pa.Array", bool], Tuple[np.ndarray, np.ndarray, np.ndarray]]


def resolve(rows: Rows, defaults: ItemDefaults, measure: Measure, bucket_for, label: str
            ) -> Tuple[Resolved, List[RowError]]:
    """`measure(texts, instruction) -> (used, raw, limit)` arrays (the family's text_length_arrays);
    `bucket_for(tokens)`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    d = defaults.spatial_divisor
    h, w = _or(rows.heights, defaults.height), _or(rows.widths, defaults.width)
    frames, steps = _or(rows.frames, defaults.num_frames), _or(rows.steps, defaults.steps)
    guidance = _floats(rows.guidance, defaults.guidance_scale)
    fps = _floats(rows.fps, defaults.fps)
    cfg = guidance > 1.0
    negatives = pc.fill_null(rows.negatives, defaults.negative_prompt)
    pos_used, pos_raw, pos_limit = measure(rows.prompts, True)
    neg = negatives.dictionary_encode()  # most rows share the job's negative prompt: measure each once
    neg_used = measure(neg.dictionary, False)[0][neg.indices.to_numpy(zero_copy_only=False)]
    truncated = pos_raw > pos_limit

    # The first rule a row breaks is its error, in the order the rules are checked.
    bad_size = (h % d != 0) | (w % d != 0)
    frame_errors = {int(f): defaults.frames_error(int(f)) for f in np.unique(frames)}
    bad_frames = ~bad_size & np.isin(frames, [f for f, e in frame_errors.items() if e is not None])
    bad = bad_size | bad_frames
    bad_fps = np.zeros(len(rows), bool)
    if defaults.fps_model:
        bad_fps = ~bad & _valid(rows.fps) & (fps != defaults.fps)
        bad |= bad_fps
    bad_distilled = np.zeros(len(rows), bool)
    if defaults.distilled_model:
        bad_distilled = ~bad & cfg
        bad |= bad_distilled
    bad_steps = ~bad & (steps < defaults.min_steps)
    bad |= bad_steps
    bad_long = ~bad & truncated if defaults.on_long_prompt == "fail" else np.zeros(len(rows), bool)
    bad |= bad_long
    errors = [_row_error(i, rows, label, d, h, w, frames, frame_errors, fps, guidance, pos_raw, pos_limit,
                         defaults, bad_size, bad_frames, bad_fps, bad_distilled, bad_steps, steps)
              for i in np.flatnonzero(bad).tolist()]

    ok = ~bad
    keep = pa.array(ok)
    keys = rows.keys.filter(keep)
    cfg_ok = cfg[ok]
    tokens = np.where(cfg_ok, np.maximum(pos_used[ok], neg_used[ok]), pos_used[ok])
    distinct, inverse = np.unique(tokens, return_inverse=True)
    bucket = np.array([bucket_for(int(t)) for t in distinct.tolist()], np.int64)[inverse.reshape(-1)]
    given = rows.seeds.filter(keep)
    given_seed = pc.fill_null(given, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    has_seed = _valid(given)
    prompts, negatives = rows.prompts.filter(keep), pc.if_else(pa.array(cfg_ok), negatives.filter(keep), "")
    lines, truncated, fps = rows.lines[ok], truncated[ok], fps[ok]
    extra = None if rows.extra is None else rows.extra.filter(keep)
    sig: Tuple[np.ndarray, ...] = (h[ok], w[ok], bucket, steps[ok], np.where(cfg_ok, guidance[ok], 1.0), cfg_ok,
                                   frames[ok])
    n = defaults.images_per_prompt
    if n > 1:
        # Every column repeated per sample; a sample's key and seed are its own (seed s, s+1, ...).
        row = np.repeat(np.arange(len(lines)), n)
        sample = np.tile(np.arange(n, dtype=np.int64), len(lines))
        take = pa.array(row)
        keys = pc.binary_join_element_wise(keys.take(take), pa.array([f"-{i}" for i in range(n)] * len(lines)), "")
        prompts, negatives = prompts.take(take), negatives.take(take)
        extra = None if extra is None else extra.take(take)
        given_seed = ((given_seed[row].astype(np.uint64) + sample.astype(np.uint64))
                      % np.uint64(SEED_END)).astype(np.int64)
        has_seed, lines, tokens, truncated, fps = has_seed[row], lines[row], tokens[row], truncated[row], fps[row]
        sig = tuple(c[row] for c in sig)
    derived, key_hash = derive_seeds(defaults.job_seed, keys)
    seeds = np.where(has_seed, given_seed, derived)
    out = Resolved(keys=keys, prompts=prompts, negatives=negatives, seeds=seeds.astype(np.int64), lines=lines,
                   tokens=tokens, truncated=truncated, fps=fps, key_hash=key_hash, sig=sig, extra=extra)
    return out, errors


def _row_error(i, rows, label, d, h, w, frames, frame_errors, fps, guidance, pos_raw, pos_limit, defaults,
               bad_size, bad_frames, bad_fps, bad_distilled, bad_steps, steps) -> RowError:
    line, key = int(rows.lines[i]), rows.keys[i].as_py()
    if bad_size[i]:
        hi, wi = int(h[i]), int(w[i])
        return RowError(label, line, key, f"size {hi}x{wi} is not a multiple of {d} (VAE downsampling x patch size); "
                                          f"use e.g. {round(hi / d) * d or d}x{round(wi / d) * d or d}")
    if bad_frames[i]:
        return RowError(label, line, key, frame_errors[int(frames[i])])
    if bad_fps[i]:
        f = float(fps[i])
        return RowError(label, line, key,
                        f"fps={f:g}, but {defaults.fps_model} conditions on the frame rate and "
                        f"a batch shares one: drop the row's fps (the job's is {defaults.fps:g}) or run "
                        f"these rows in a job with sampling.fps={f:g}")
    if bad_distilled[i]:
        return RowError(label, line, key,
                        f"guidance_scale={float(guidance[i]):g}, but {defaults.distilled_model} is guidance-distilled "
                        f"(no negative branch); drop the row's guidance_scale or set it to 1.0")
    if bad_steps[i]:
        return RowError(label, line, key,
                        f"steps={int(steps[i])}, but {defaults.model_name}'s scheduler takes at least "
                        f"{defaults.min_steps}; set the row's steps to {defaults.min_steps} or more")
    return RowError(label, line, key, f"prompt has {int(pos_raw[i])} tokens, "
                                      f"more than the model's {int(pos_limit[i])}; "
                                      f"shorten it or set model.on_long_prompt=truncate")
