"""The planner: stream a dataset once -> signature-pure work units + plan.json, in bounded memory.

    file ──▶ chunks (bytes cut at line ends) ──▶ N processes: parse, validate, count tokens,
         sha256          bounded in flight          sign, spill sorted by signature (chunk.py)
    ──▶ key-uniqueness check over 64-bit key hashes ──▶ per signature, in signature order:
        concatenate its batches chunk by chunk (dataset order) and cut equal units ──▶ _plan/

Memory: the chunks in flight, one unit being written, and for the uniqueness check 8 bytes per
row up to 64M rows (then several passes over hash ranges). Deterministic: units depend on the dataset and config only, not on
the number of processes or the chunk size (a signature's run is in dataset order).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from jobs.config import GenerateConfig
from jobs.dataset import DatasetError, RowError, format_row_errors
from jobs.plan import Signature
from jobs.plan.chunk import ChunkResult, ChunkTask, init_process, process_chunk, ChunkContext, run_in_process
from jobs.plan.units import SIGNATURE_COLUMNS, PlanManifest, UnitInfo, item_cost, unit_name

log = logging.getLogger("jobs.plan")

SPILL_DIR = "spill"


@dataclass
class PlanResult:
    manifest: PlanManifest
    errors: List[RowError] = field(default_factory=list)
    seconds: float = 0.0


def dataset_file(cfg: GenerateConfig) -> Tuple[Path, str]:
    from jobs.dataset import _check_readable, resolve_format, resolve_path

    path = resolve_path(cfg.dataset)
    fmt = resolve_format(cfg.dataset, path)
    _check_readable(path, bundled=not cfg.dataset.path)
    return path, fmt


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _byte_chunks(path: Path, chunk_bytes: int, digest) -> Iterator[ChunkTask]:
    """JSONL/TXT cut at line ends; lines are counted here so every chunk knows its first line."""
    index, line, rest = 0, 1, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_bytes)
            digest.update(block)
            data = rest + block
            if not block:
                if data:
                    yield ChunkTask(index=index, first_line=line, data=data)
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a chunk: keep reading
                rest = data
                continue
            body, rest = data[:cut], data[cut:]
            yield ChunkTask(index=index, first_line=line, data=body)
            index += 1
            line += body.count(b"\n")


def _row_chunks(cfg: GenerateConfig, path: Path, fmt: str, rows_per_chunk: int) -> Iterator[ChunkTask]:
    from jobs.dataset_formats import READERS

    index, rows = 0, []
    for row in READERS[fmt](path, cfg.dataset.prompt_field, cfg.dataset.key_field, cfg.dataset.max_line_bytes):
        rows.append(row)
        if len(rows) >= rows_per_chunk:
            yield ChunkTask(index=index, rows=rows)
            index, rows = index + 1, []
    if rows:
        yield ChunkTask(index=index, rows=rows)


def _map_ordered(tasks: Iterator[ChunkTask], workers: int, initargs: tuple) -> Iterator[ChunkResult]:
    """Results in task order. `workers` processes in all: this one and a pool of workers - 1.
    This process works too: it takes a chunk itself whenever the pool has enough queued (at most
    3 chunks per pool process in flight; Pool.imap would read the whole file ahead into its
    queue), so nothing waits while the pool's interpreters start (seconds: they import the
    model family's modules) and one core is not spent on dispatch alone."""
    ctx = ChunkContext.build(*initargs)
    if workers <= 1:
        for task in tasks:
            yield process_chunk(ctx, task)
        return
    import multiprocessing as mp

    # spawn: the parent may hold torch/tokenizer threads that a fork would copy half-locked.
    with mp.get_context("spawn").Pool(workers - 1, initializer=init_process, initargs=initargs) as pool:
        pending: deque = deque()  # AsyncResult (the pool's) or ChunkResult (done here), in task order
        in_pool = 0
        for task in tasks:
            in_pool = sum(1 for p in pending if not isinstance(p, ChunkResult) and not p.ready())
            if in_pool < 3 * (workers - 1):
                pending.append(pool.apply_async(run_in_process, (task,)))
            else:
                pending.append(process_chunk(ctx, task))
            while pending and (isinstance(pending[0], ChunkResult) or pending[0].ready()):
                done = pending.popleft()
                yield done if isinstance(done, ChunkResult) else done.get()
        while pending:
            done = pending.popleft()
            yield done if isinstance(done, ChunkResult) else done.get()


@dataclass
class _Collected:
    results: List[ChunkResult] = field(default_factory=list)
    errors: List[RowError] = field(default_factory=list)
    rows: int = 0
    truncated: int = 0
    unknown: set = field(default_factory=set)


def _spill_column(res: ChunkResult, name: str) -> np.ndarray:
    import pyarrow as pa

    with pa.memory_map(res.path) as src:
        reader = pa.ipc.open_file(src)
        parts = [reader.get_batch(b).column(name).to_numpy() for b in range(reader.num_record_batches)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


HASHES_PER_PASS = 64 << 20  # 512 MB of key hashes in memory at most


def _duplicates(col: _Collected, label: str) -> Dict[int, set]:
    """Rows whose key was already used by an earlier row: {chunk index: {line, ...}} to drop, with
    a RowError each (first occurrence wins, as in load_dataset). The 64-bit key hashes are read
    back from the spill files, in passes over disjoint hash ranges, so memory stays bounded at any
    dataset size (one pass up to 64M rows). Cheap when there are none: one sort per pass."""
    import pyarrow as pa

    passes = max(1, -(-col.rows // HASHES_PER_PASS))
    found = []
    for p in range(passes):
        parts = []
        for res in col.results:
            if res.groups:
                h = _spill_column(res, "key_hash")
                parts.append(h if passes == 1 else h[h % np.uint64(passes) == p])
        s = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)
        found.append(np.unique(s[1:][s[1:] == s[:-1]]))
    candidates = np.concatenate(found)
    if not len(candidates):
        return {}
    seen: Dict[str, List[Tuple[int, int]]] = {}
    for res in col.results:
        if not res.groups:
            continue
        with pa.memory_map(res.path) as src:
            reader = pa.ipc.open_file(src)
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                mask = np.isin(batch.column("key_hash").to_numpy(), candidates)
                if mask.any():
                    keys = batch.column("key").to_numpy(zero_copy_only=False)[mask]
                    lines = batch.column("line").to_numpy()[mask]
                    for k, ln in zip(keys, lines):
                        seen.setdefault(k, []).append((int(ln), res.index))
    drop: Dict[int, set] = {}
    for key, where in seen.items():
        if len(where) < 2:
            continue  # a hash collision of distinct keys
        where.sort()
        first = where[0][0]
        for ln, chunk in where[1:]:
            drop.setdefault(chunk, set()).add(ln)
            col.errors.append(RowError(label, ln, key, f"duplicate key {key!r} (first at {label}:{first})"))
    return drop


def _stream(tasks: Iterator[ChunkTask], workers: int, initargs: tuple, t0: float) -> Optional[_Collected]:
    """Every chunk through the processes, in order; None as soon as one is declined."""
    col = _Collected()
    for res in _map_ordered(tasks, workers, initargs):
        if res.declined:
            return None
        col.results.append(res)
        col.errors += res.errors
        col.truncated += res.truncated
        col.unknown |= res.unknown_fields
        col.rows += res.n_rows
        if res.index % 50 == 49:
            log.info("planned %d rows (%.0f rows/s)", col.rows, col.rows / (time.perf_counter() - t0))
    return col


def plan_dataset(cfg: GenerateConfig, divisor: int, work_dir: Path) -> PlanResult:
    """Stream the dataset into `work_dir` (unit files); the caller publishes it as _plan/."""
    t0 = time.perf_counter()
    path, fmt = dataset_file(cfg)
    label = str(path)
    spill = work_dir / SPILL_DIR
    spill.mkdir(parents=True)
    size = path.stat().st_size
    workers = cfg.plan.workers or os.cpu_count() or 1
    if size <= cfg.plan.chunk_mb * (1 << 20):
        workers = 1  # one chunk: starting processes would cost more than it saves
    initargs = (cfg, label, path.stem, fmt, str(spill), divisor)
    digest = hashlib.sha256()
    col = None
    if fmt == "jsonl":
        col = _stream(_byte_chunks(path, int(cfg.plan.chunk_mb * (1 << 20)), digest), workers, initargs, t0)
        if col is None:  # a chunk the fast lane would not vouch for: the readers' rules decide
            log.info("%s: not plain LF-separated JSON objects throughout; reading it row by row", label)
            shutil.rmtree(spill)
            spill.mkdir()
    if col is None:
        digest = None
        col = _stream(_row_chunks(cfg, path, fmt, rows_per_chunk=20000), workers, initargs, t0)
    n_rows = col.rows
    if col.unknown:
        log.warning("%s: ignoring fields %s", label, ", ".join(sorted(map(repr, col.unknown))))
    streamed = time.perf_counter() - t0
    drop = _duplicates(col, label)
    col.errors.sort(key=lambda e: e.line)
    keep_until = _limit_line(col, drop, cfg.dataset.limit)
    n_valid = n_rows - sum(len(v) for v in drop.values())
    if not n_valid and not col.errors:
        raise DatasetError(f"dataset.path={label!r} holds no prompts (empty, or blank lines only)")
    if col.errors and cfg.dataset.on_error == "fail":
        raise DatasetError(format_row_errors(label, col.errors)
                           + "\nFix these rows, or set dataset.on_error=skip to generate the good rows "
                             "and write the bad ones to errors.jsonl in output_dir.", col.errors)
    if not n_valid:
        raise DatasetError(format_row_errors(label, col.errors) + "\nEvery row is bad, so there is nothing to generate.",
                           col.errors)
    units, signatures = _write_units(col.results, drop, keep_until, cfg, work_dir)
    shutil.rmtree(spill)
    stat = path.stat()
    dataset = {"path": label, "format": fmt, "digest": digest.hexdigest() if digest else file_digest(path),
               "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "records": sum(u.count for u in units),
               "bad_rows": len(col.errors), "limit": cfg.dataset.limit}
    manifest = PlanManifest(identity={}, dataset=dataset, unit_items=cfg.plan.unit_items, units=units,
                            truncated=col.truncated, signatures=signatures)
    seconds = time.perf_counter() - t0
    log.info("plan: %d rows -> %d items in %d units of %d signatures, %d bad rows, %.1fs (%.0f rows/s, %d processes; "
             "streaming %.1fs, key check + units %.1fs)", n_rows + len(col.errors), manifest.n_items, len(units),
             len(signatures), len(col.errors), seconds, (n_rows + len(col.errors)) / max(seconds, 1e-9), workers,
             streamed, seconds - streamed)
    return PlanResult(manifest=manifest, errors=col.errors, seconds=seconds)


def _limit_line(col: _Collected, drop: Dict[int, set], limit: int) -> Optional[int]:
    """dataset.limit = N: the line of the N-th valid row (rows after it are validated, not planned)."""
    if not limit:
        return None
    seen = 0
    for res in col.results:
        lines = np.sort(_spill_column(res, "line")) if res.groups else []  # file order
        dropped = drop.get(res.index, ())
        for ln in lines:
            if ln in dropped:
                continue
            seen += 1
            if seen == limit:
                return int(ln)
    return None


def _pieces(results: List[ChunkResult]) -> Dict[tuple, List[Tuple[int, int]]]:
    by_sig: Dict[tuple, List[Tuple[int, int]]] = {}
    for ci, res in enumerate(results):
        for b, (sig, _) in enumerate(res.groups):
            by_sig.setdefault(sig, []).append((ci, b))
    return by_sig


def _write_units(results: List[ChunkResult], drop: Dict[int, set], keep_until: Optional[int],
                 cfg: GenerateConfig, out: Path) -> Tuple[List[UnitInfo], Dict[str, int]]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def batch_of(ci: int, b: int):
        res = results[ci]
        with pa.memory_map(res.path) as src:
            batch = pa.ipc.open_file(src).get_batch(b)
        mask = None
        if res.index in drop:
            mask = pc.invert(pc.is_in(batch.column("line"), pa.array(sorted(drop[res.index]), pa.int64())))
        if keep_until is not None:
            m = pc.less_equal(batch.column("line"), keep_until)
            mask = m if mask is None else pc.and_(mask, m)
        if mask is not None:
            batch = batch.filter(mask)
        return batch.drop_columns(["key_hash"])

    units: List[UnitInfo] = []
    signatures: Dict[str, int] = {}
    by_sig = _pieces(results)
    for sig_fields in sorted(by_sig):
        pieces = by_sig[sig_fields]
        sig = Signature(**dict(zip(SIGNATURE_COLUMNS, sig_fields)), dtype=cfg.model.dtype)
        affected = drop or keep_until is not None
        n = sum(batch_of(ci, b).num_rows if affected else results[ci].groups[b][1] for ci, b in pieces)
        if not n:
            continue
        signatures[str(sig)] = n
        k = math.ceil(n / cfg.plan.unit_items)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]  # equal units, no stub tail
        buffered, have = [], 0
        for ci, b in pieces:
            batch = batch_of(ci, b)
            while batch.num_rows:
                take = min(batch.num_rows, sizes[0] - have)
                buffered.append(batch.slice(0, take))
                batch = batch.slice(take)
                have += take
                if have == sizes[0]:
                    uid = len(units)
                    table = pa.Table.from_batches(buffered)
                    for name, value in zip(SIGNATURE_COLUMNS, sig_fields):
                        table = table.append_column(name, pa.array([value] * table.num_rows))
                    pq.write_table(table, out / f"{unit_name(uid)}.parquet")
                    units.append(UnitInfo(id=uid, signature=sig, count=have, cost=have * item_cost(sig)))
                    buffered, have = [], 0
                    sizes.pop(0)
    return units, signatures
