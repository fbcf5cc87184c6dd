"""One chunk of the dataset -> validated, tokenized, signed items in a spill file, sorted by signature.

Runs in the planner's worker processes (or in-process for a small dataset). A chunk is either raw
bytes of a JSONL/TXT file cut at line ends (parsed here, so parsing is parallel too) or rows a
sequential reader already parsed (jobs/dataset/formats.py: any format, and JSONL the fast lane
declined). The spill file is Arrow IPC with one record
batch per signature, rows in file order within each: concatenating a signature's batches over
the chunks in order gives that signature's run in dataset order, with no global sort.

Key uniqueness across the whole dataset cannot be checked inside a chunk: each row's 64-bit key
hash (from the digest that derives its seed, jobs.plan.derive_seeds) goes back to the planner,
which checks them all at the end (plan/build.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

from jobs.dataset.rules import Record, RowError, RowValidator
from jobs.plan import Signature
from jobs.plan.resolve import ItemDefaults, Rows, resolve
from jobs.plan.units import SIGNATURE_COLUMNS, item_cost

if TYPE_CHECKING:
    from jobs.config import ModelConfig
    from jobs.models.base import ModelFamily


@dataclass
class ChunkTask:
    index: int
    first_line: int = 1
    data: bytes = b""  # JSONL/TXT bytes, cut at a line end
    rows: Optional[list] = None  # or (line, value) pairs from a sequential reader
    file: int = 0  # which of the dataset's files (a chunk never spans two); lines are that file's


@dataclass
class ChunkResult:
    index: int
    path: str
    groups: List[Tuple[tuple, int]]  # (signature fields, rows) per record batch, in batch order
    n_rows: int
    file: int = 0
    errors: List[RowError] = field(default_factory=list)
    truncated: int = 0
    unknown_fields: set = field(default_factory=set)
    declined: bool = False  # a byte chunk the fast lane would not vouch for


class _ChunkValidator(RowValidator):
    """Per-row checks of the dataset, minus key uniqueness (checked across chunks by the planner)."""

    def _claim_key(self, line: int, record: Record, derived: bool):
        return record


@dataclass
class ChunkContext:
    """What every chunk needs, built once per process."""

    files: Tuple[Tuple[str, str], ...]  # (label, stem) a dataset file: errors name the label, keys derive from the stem
    max_line_bytes: int
    prompt_field: str
    key_field: str
    keep_fields: tuple
    defaults: ItemDefaults
    spill_dir: str
    family: ModelFamily
    model_cfg: ModelConfig
    tokenizer: object
    bucket_for: object

    @classmethod
    def build(cls, cfg, files: Tuple[Tuple[str, str], ...], spill_dir: str, divisor: int) -> "ChunkContext":
        from jobs.models.registry import get_family
        from jobs.plan.lengths import planning_tokenizer
        from padding import get_padder

        family = get_family(cfg.model.family)
        padder = get_padder(cfg.model.family, buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
        defaults = ItemDefaults(height=cfg.sampling.height, width=cfg.sampling.width, steps=cfg.sampling.steps,
                                guidance_scale=cfg.sampling.guidance_scale,
                                negative_prompt=cfg.sampling.negative_prompt, job_seed=cfg.sampling.seed,
                                dtype=cfg.model.dtype, spatial_divisor=divisor,
                                on_long_prompt=cfg.model.on_long_prompt, num_frames=cfg.sampling.num_frames,
                                fps=cfg.sampling.fps,
                                frames_error=functools.partial(family.frames_error, cfg.model),
                                fps_model=family.pipeline_class if family.fps_conditions else "",
                                distilled_model="" if family.guidance else cfg.model.name,
                                min_steps=family.min_steps, model_name=cfg.model.name,
                                images_per_prompt=cfg.sampling.images_per_prompt)
        return cls(files=tuple(files), max_line_bytes=cfg.dataset.max_line_bytes,
                   prompt_field=cfg.dataset.prompt_field, key_field=cfg.dataset.key_field,
                   keep_fields=tuple(cfg.dataset.keep_fields), defaults=defaults,
                   spill_dir=spill_dir, family=family, model_cfg=cfg.model,
                   tokenizer=planning_tokenizer(family, cfg.model), bucket_for=padder.bucket_for)


def validate(ctx: ChunkContext, task: ChunkTask) -> Tuple[Optional[Rows], List[RowError], set]:
    """The chunk's valid rows as columns, and its bad rows. A byte chunk (JSONL) is taken by Arrow's
    fast lane or not at all (None: the planner then reads the whole file row by row, with the
    dataset readers' exact rules for line endings, encodings and line lengths)."""
    label, stem = ctx.files[task.file]
    if task.rows is None:
        from jobs.plan.fast_jsonl import arrow_rows

        # Kept fields are not in the fast lane's known set: a row holding one sends the file row by row.
        rows = arrow_rows(task.data, task.first_line, stem, ctx.prompt_field, ctx.key_field, ctx.max_line_bytes)
        return rows, [], set()
    validator = _ChunkValidator(label, stem, ctx.prompt_field, ctx.key_field, keep=ctx.keep_fields)
    records: List[Record] = []
    errors: List[RowError] = []
    for line, value in task.rows:
        out = validator.check(line, value)
        if type(out) is Record:
            records.append(out)
        else:
            errors.append(out)
    return Rows.from_records(records), errors, set(validator.unknown_fields)


def process_chunk(ctx: ChunkContext, task: ChunkTask) -> ChunkResult:
    import pyarrow as pa

    rows, errors, unknown = validate(ctx, task)
    if rows is None:
        return ChunkResult(index=task.index, path="", groups=[], n_rows=0, declined=True, file=task.file)
    measure = lambda texts, instruction: ctx.family.text_length_arrays(ctx.tokenizer, texts, ctx.model_cfg, instruction)  # noqa: E731
    res, row_errors = resolve(rows, ctx.defaults, measure, ctx.bucket_for, ctx.files[task.file][0])
    errors += row_errors
    n = len(res)
    # Stable (lexsort is): within a signature, rows keep file order; signatures in tuple order.
    order = np.lexsort(res.sig[::-1])
    sig = [c[order] for c in res.sig]
    change = np.zeros(n, bool)
    change[:1] = True  # a signature run starts at row 0 and wherever a field changes
    for c in sig:
        change[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(change).tolist()
    bounds = list(zip(starts, starts[1:] + [n]))
    # The signature's fields as the Python values a tuple of them always held (ints, a float, a bool).
    kinds = (int, int, int, int, float, bool, int)
    sigs = [tuple(k(c[s].item()) for k, c in zip(kinds, sig)) for s, _ in bounds]
    cost = np.repeat([item_cost(Signature(**dict(zip(SIGNATURE_COLUMNS, s)), dtype=ctx.defaults.dtype)) for s in sigs],
                     [e - s for s, e in bounds]).astype(np.float64)
    take = pa.array(order, pa.int64())
    table = pa.table({
        "key": res.keys.take(take),
        "prompt": res.prompts.take(take),
        "negative_prompt": res.negatives.take(take),
        "seed": pa.array(res.seeds[order], pa.int64()),
        "line": pa.array(res.lines[order], pa.int64()),
        "text_tokens": pa.array(res.tokens[order], pa.int32()),
        "truncated": pa.array(res.truncated[order], pa.bool_()),
        "cost": pa.array(cost, pa.float64()),
        "fps": pa.array(res.fps[order], pa.float64()),
        "key_hash": pa.array(res.key_hash[order], pa.uint64()),
    })
    if ctx.keep_fields:  # only then: the unit files of every other plan keep their columns
        extra = res.extra if res.extra is not None else pa.nulls(n, pa.string())
        table = table.append_column("extra", extra.take(take))
    path = str(Path(ctx.spill_dir) / f"chunk-{task.index:07d}.arrow")
    groups: List[Tuple[tuple, int]] = []
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for s, (start, end) in zip(sigs, bounds):
            # One record batch per signature: the planner reads a signature's rows of a chunk by index.
            writer.write_batch(table.slice(start, end - start).combine_chunks().to_batches()[0])
            groups.append((s, end - start))
    return ChunkResult(index=task.index, path=path, groups=groups, n_rows=n, errors=errors,
                       truncated=int(res.truncated.sum()), unknown_fields=unknown, file=task.file)


# -- the per-process context of a multiprocessing pool --------------------------------------

_CTX: Optional[ChunkContext] = None


def inherit_context(ctx: Optional[ChunkContext]) -> None:
    """Set (just before a fork) or clear (just after) the context forked children start with."""
    global _CTX
    _CTX = ctx


def init_process(cfg, files: Tuple[Tuple[str, str], ...], spill_dir: str, divisor: int) -> None:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the processes are the parallelism
    global _CTX
    if _CTX is None:  # spawned (a forked child inherits its parent's, built from the same arguments)
        _CTX = ChunkContext.build(cfg, files, spill_dir, divisor)


def run_in_process(task: ChunkTask) -> ChunkResult:
    assert _CTX is not None, "init_process was not called in this process"
    return process_chunk(_CTX, task)
