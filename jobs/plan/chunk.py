"""One chunk of the dataset -> validated, tokenized, signed items in a spill file, sorted by signature.

Runs in the planner's worker processes (or in-process for a small dataset). A chunk is either raw
bytes of a JSONL/TXT file cut at line ends (parsed here, so parsing is parallel too) or rows a
sequential reader already parsed (CSV, Parquet, tar). The spill file is Arrow IPC with one record
batch per signature, rows in file order within each: concatenating a signature's batches over
the chunks in order gives that signature's run in dataset order, with no global sort.

Key uniqueness across the whole file cannot be checked inside a chunk: each row's 64-bit key
hash goes back to the planner, which checks them all at the end (plan/build.py).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from jobs.dataset_validate import Record, RowError, RowValidator
from jobs.plan import ItemDefaults, resolve_items, text_length_table
from jobs.plan.units import SIGNATURE_COLUMNS, item_cost


@dataclass
class ChunkTask:
    index: int
    first_line: int = 1
    data: bytes = b""  # JSONL/TXT bytes, cut at a line end
    rows: Optional[list] = None  # or (line, value) pairs from a sequential reader


@dataclass
class ChunkResult:
    index: int
    path: str
    groups: List[Tuple[tuple, int]]  # (signature fields, rows) per record batch, in batch order
    key_hashes: np.ndarray  # uint64, one per valid row, file order
    lines: np.ndarray  # int64, the same rows' lines
    errors: List[RowError] = field(default_factory=list)
    truncated: int = 0
    unknown_fields: set = field(default_factory=set)


class _ChunkValidator(RowValidator):
    """Per-row checks of the dataset, minus key uniqueness (checked across chunks by the planner)."""

    def _claim_key(self, line: int, record: Record, derived: bool):
        return record


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


@dataclass
class ChunkContext:
    """What every chunk needs, built once per process."""

    label: str
    stem: str
    fmt: str
    prompt_field: str
    key_field: str
    defaults: ItemDefaults
    spill_dir: str
    family: object
    model_cfg: object
    tokenizer: object
    bucket_for: object

    @classmethod
    def build(cls, cfg, label: str, stem: str, fmt: str, spill_dir: str, divisor: int) -> "ChunkContext":
        from jobs.models.registry import get_family
        from jobs.plan.lengths import LengthTokenizer
        from padding import get_padder

        family = get_family(cfg.model.family)
        padder = get_padder(cfg.model.family, buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
        defaults = ItemDefaults(height=cfg.sampling.height, width=cfg.sampling.width, steps=cfg.sampling.steps,
                                guidance_scale=cfg.sampling.guidance_scale,
                                negative_prompt=cfg.sampling.negative_prompt, job_seed=cfg.sampling.seed,
                                dtype=cfg.model.dtype, spatial_divisor=divisor,
                                on_long_prompt=cfg.model.on_long_prompt)
        return cls(label=label, stem=stem, fmt=fmt, prompt_field=cfg.dataset.prompt_field,
                   key_field=cfg.dataset.key_field, defaults=defaults, spill_dir=spill_dir, family=family,
                   model_cfg=cfg.model, tokenizer=LengthTokenizer(family.load_tokenizer(cfg.model)),
                   bucket_for=padder.bucket_for)


def _rows(ctx: ChunkContext, task: ChunkTask):
    if task.rows is not None:
        return task.rows
    from jobs.dataset_formats import jsonl_rows, txt_rows

    parse = jsonl_rows if ctx.fmt == "jsonl" else txt_rows
    return parse(io.BytesIO(task.data), task.first_line)


def process_chunk(ctx: ChunkContext, task: ChunkTask) -> ChunkResult:
    import pyarrow as pa

    validator = _ChunkValidator(ctx.label, ctx.stem, ctx.prompt_field, ctx.key_field)
    records, errors = [], []
    for line, value in _rows(ctx, task):
        out = validator.check(line, value)
        (records if type(out) is Record else errors).append(out)
    lengths = text_length_table(
        records, ctx.defaults,
        lambda texts, instruction: ctx.family.text_lengths(ctx.tokenizer, texts, ctx.model_cfg, instruction))
    items, row_errors = resolve_items(records, ctx.defaults, lengths, ctx.bucket_for)
    errors += row_errors
    lines = [int(it.source.rpartition(":")[2]) for it in items]
    hashes = np.fromiter((key_hash(it.key) for it in items), dtype=np.uint64, count=len(items))
    # Stable: within a signature, rows keep file order.
    order = sorted(range(len(items)), key=lambda i: items[i].signature)
    path = str(Path(ctx.spill_dir) / f"chunk-{task.index:07d}.arrow")
    groups: List[Tuple[tuple, int]] = []
    schema = None
    with pa.OSFile(path, "wb") as sink:
        writer = None
        start = 0
        while start < len(order):
            sig = items[order[start]].signature
            end = start
            while end < len(order) and items[order[end]].signature == sig:
                end += 1
            rows = [items[i] for i in order[start:end]]
            n = len(rows)
            cost = item_cost(sig)
            batch = pa.record_batch({
                "key": pa.array([it.key for it in rows], pa.string()),
                "prompt": pa.array([it.prompt for it in rows], pa.string()),
                "negative_prompt": pa.array([it.negative_prompt for it in rows], pa.string()),
                "seed": pa.array([it.seed for it in rows], pa.int64()),
                "line": pa.array([lines[i] for i in order[start:end]], pa.int64()),
                "text_tokens": pa.array([it.text_tokens for it in rows], pa.int32()),
                "truncated": pa.array([it.truncated for it in rows], pa.bool_()),
                "cost": pa.array(np.full(n, cost), pa.float64()),
                "key_hash": pa.array(hashes[order[start:end]], pa.uint64()),
            })
            if writer is None:
                schema = batch.schema
                writer = pa.ipc.new_file(sink, schema)
            writer.write_batch(batch)
            groups.append((tuple(getattr(sig, c) for c in SIGNATURE_COLUMNS), n))
            start = end
        if writer is not None:
            writer.close()
    return ChunkResult(index=task.index, path=path, groups=groups, key_hashes=hashes,
                       lines=np.asarray(lines, dtype=np.int64), errors=errors,
                       truncated=sum(1 for it in items if it.truncated),
                       unknown_fields=set(validator.unknown_fields))


# -- the per-process context of a multiprocessing pool --------------------------------------

_CTX: Optional[ChunkContext] = None


def init_process(cfg, label: str, stem: str, fmt: str, spill_dir: str, divisor: int) -> None:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the processes are the parallelism
    global _CTX
    _CTX = ChunkContext.build(cfg, label, stem, fmt, spill_dir, divisor)


def run_in_process(task: ChunkTask) -> ChunkResult:
    assert _CTX is not None, "init_process was not called in this process"
    return process_chunk(_CTX, task)
