"""The planner: stream a dataset once -> signature-pure work units + plan.json, in bounded memory.

    files ──▶ chunks (bytes cut at line ends) ──▶ N processes: parse, validate, count tokens,
    in order, sha256     bounded in flight          sign, spill sorted by signature (chunk.py)
    each
    ──▶ key-uniqueness check over 64-bit key hashes ──▶ per signature, in signature order:
        concatenate its batches chunk by chunk (dataset order) and cut equal units ──▶ _plan/
                                                      (unit files written by the N processes)

The N processes are this one and a pool of N - 1, forked where that is safe (no start-up cost)
and spawned otherwise; this one takes chunks and unit files too whenever the pool has enough
queued. Memory: the chunks in flight, the units being written, and for the uniqueness check 8
bytes per row up to 64M rows (then several passes over hash ranges). Deterministic: units depend
on the dataset and config only, not on the number of processes, the chunk size or which process
took what (a signature's run is in dataset order); tests/test_plan_golden.py freezes them.

A dataset of several files (a folder, a brace list: jobs/dataset/paths.py) is read file after file
in sorted order, as one stream: a chunk never spans two files, so it knows its file (an index into
plan.json's `dataset.files`) and its first line there. Dataset order is (file, line); each file
keeps its own line numbers and derived keys (`<file stem>-<line>`), and a file the JSONL fast lane
declines is read again row by row on its own. One file plans exactly as it always did: no file
column in the units, no file list in plan.json.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import shutil
import time
from collections import deque
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Generator, Iterator, List, Optional, Set, Tuple, Union

import numpy as np

from jobs.config import GenerateConfig
from jobs.dataset import DatasetError, RowError, dataset_label, dataset_sources, format_row_errors
from jobs.dataset.hf import hf_digest, hf_rows, open_hf
from jobs.dataset.rules import derived_key, keyless_collision, unknown_fields_message
from jobs.output.layout import unit_name
from jobs.plan import Signature
from jobs.plan.chunk import ChunkContext, ChunkResult, ChunkTask, init_process, process_chunk, run_in_process
from jobs.plan.digests import combined_digest, file_digest, file_record
from jobs.plan.units import FILE_COLUMN, SIGNATURE_COLUMNS, PlanManifest, UnitInfo, item_cost

if TYPE_CHECKING:
    from multiprocessing.pool import Pool

log = logging.getLogger("jobs.plan")

SPILL_DIR = "spill"


@dataclass
class PlanResult:
    manifest: PlanManifest
    errors: List[RowError] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class DatasetFile:
    """One file of the dataset; its place in dataset_files() is the index unit files record."""

    path: Path
    fmt: str


def dataset_files(cfg: GenerateConfig) -> List[DatasetFile]:
    """The files `dataset.path` names, in the order they are planned, each checked readable."""
    return [DatasetFile(path, fmt) for path, fmt in dataset_sources(cfg.dataset)]


def file_stat(f: DatasetFile) -> Tuple[int, int]:
    """(bytes, mtime_ns) that tell a rerun whether to hash a file again; (0, 0) for a Hugging Face
    dataset (a folder or a Hub id: its fingerprint is read again instead, without a pass over its rows)."""
    if f.fmt == "hf":
        return 0, 0
    st = f.path.stat()
    return st.st_size, st.st_mtime_ns


def source_digest(cfg: GenerateConfig, f: DatasetFile) -> str:
    """One source's digest: a file's bytes' sha256, a Hugging Face dataset's fingerprint."""
    return hf_digest(open_hf(str(f.path), cfg.dataset.split)) if f.fmt == "hf" else file_digest(f.path)


def dataset_digest(files: List[DatasetFile], digests: List[str]) -> str:
    """The dataset's digest in the run identity: one file's sha256 (as it always was), or one digest
    over every file's name and sha256, in order (names decide derived keys)."""
    if len(files) == 1:
        return digests[0]
    return combined_digest((f.path.name, d) for f, d in zip(files, digests))


def _reading(path: Path, tasks: Iterator[ChunkTask]) -> Iterator[ChunkTask]:
    """The chunks of the dataset file `path`, its read errors (permission, I/O) a DatasetError that names it
    and the fix: not a traceback, nor an output folder's write error (exit 75, which a scheduler retries)."""
    try:
        yield from tasks
    except OSError as exc:
        raise DatasetError(f"dataset.path={str(path)!r}: cannot read it ({exc.strerror or exc}); check its "
                           f"permissions and its disk, or leave it out of dataset.path") from exc


def _byte_chunks(path: Path, file: int, chunk_bytes: int, digest, index: Iterator[int],
                 declined: Set[int], size: int) -> Iterator[ChunkTask]:
    """JSONL/TXT cut at line ends; lines are counted here so every chunk knows its first line. Once a
    chunk of this file is declined (`declined`), the rest is still read for its digest but not parsed.
    Its first `size` bytes only (its size before the read): a file a writer still appends to is not
    chased row by row, and the plan refuses it after (_check_unchanged). A size of 0 bounds nothing: a
    file that stats empty may still hold bytes (/proc's), read to its end as before."""
    line, rest = 1, b""
    left = size if size > 0 else None
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_bytes if left is None else min(chunk_bytes, left))
            if left is not None:
                left -= len(block)
            digest.update(block)
            if file in declined:  # read row by row later; only its digest is made here
                rest = b""
                if not block:
                    return
                continue
            data = rest + block
            if not block:
                if data:
                    yield ChunkTask(index=next(index), first_line=line, data=data, file=file)
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a chunk: keep reading
                rest = data
                continue
            body, rest = data[:cut], data[cut:]
            yield ChunkTask(index=next(index), first_line=line, data=body, file=file)
            line += body.count(b"\n")


def _row_chunks(cfg: GenerateConfig, path: Path, file: int, fmt: str, rows_per_chunk: int,
                index: Iterator[int]) -> Iterator[ChunkTask]:
    from jobs.dataset.formats import READERS

    rows = []
    if fmt == "hf":
        reader = hf_rows(open_hf(str(path), cfg.dataset.split), cfg.dataset.prompt_field, cfg.dataset.max_line_bytes)
    else:
        reader = READERS[fmt](path, cfg.dataset.prompt_field, cfg.dataset.key_field, cfg.dataset.max_line_bytes,
                              keep=cfg.dataset.keep_fields)
    for row in reader:
        rows.append(row)
        if len(rows) >= rows_per_chunk:
            yield ChunkTask(index=next(index), rows=rows, file=file)
            rows = []
    if rows:
        yield ChunkTask(index=next(index), rows=rows, file=file)


class _Workers:
    """`n` processes in all: this one and a pool of n - 1 (none for n = 1), for both phases
    (chunks, then unit files). This process works too: it takes a job itself whenever the pool
    has enough queued (at most 3 per pool process in flight; Pool.imap would read the whole file
    ahead into its queue), so nothing waits while a spawned pool's interpreters start, and one
    core is not spent on dispatch alone."""

    def __init__(self, n: int, initargs: tuple):
        self.n, self.initargs = n, initargs
        self.pool: Optional[Pool] = None
        self.ctx: Optional[ChunkContext] = None

    def __enter__(self) -> "_Workers":
        self.ctx = ChunkContext.build(*self.initargs)
        if self.n > 1:
            import multiprocessing as mp

            from jobs.plan import chunk

            method = _start_method()
            log.info("planning in %d processes (this one and %d started by %s)", self.n, self.n - 1, method)
            if method == "fork":  # the children inherit this context (and what it imported) as built
                _warm_imports()
                chunk.inherit_context(self.ctx)
            try:
                self.pool = mp.get_context(method).Pool(self.n - 1, initializer=init_process, initargs=self.initargs)
            finally:
                chunk.inherit_context(None)  # forked at Pool(): no later plan in this process sees it
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def map_ordered(self, fn, remote, jobs: Iterator) -> Generator[Any, None, None]:
        """fn(job) here or remote(job) in the pool, for every job; results in job order."""
        if self.pool is None:
            for job in jobs:
                yield fn(job)
            return
        pending: deque = deque()  # (True, AsyncResult) from the pool or (False, result) done here
        try:
            for job in jobs:
                in_pool = sum(1 for remote_, p in pending if remote_ and not p.ready())
                if in_pool < 3 * (self.n - 1):
                    pending.append((True, self.pool.apply_async(remote, (job,))))
                else:
                    pending.append((False, fn(job)))
                while pending and (not pending[0][0] or pending[0][1].ready()):
                    remote_, done = pending.popleft()
                    yield done.get() if remote_ else done
            while pending:
                remote_, done = pending.popleft()
                yield done.get() if remote_ else done
        finally:  # closed early (a declined chunk): the pool's jobs still write spill files; let them end
            for remote_, p in pending:
                if remote_:
                    p.wait()


def _warm_imports() -> None:
    """What a chunk imports on first use (pyarrow's Table imports pandas: ~0.5 s), before a fork."""
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401
    import pyarrow.json  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    pa.table({"x": pa.array([0])})


def _start_method() -> str:
    """fork where it is safe, else spawn. A forked pool starts at once with every module imported
    (a spawned interpreter imports pyarrow, the tokenizer and the family's modules again before
    its first chunk). Safe here means: no other Python thread (that could hold a lock the child then
    needs) and no CUDA context. The native pools a planner holds (jemalloc's background thread,
    OpenBLAS, the tokenizers' rayon pool) register their own fork handlers, and the children run
    no torch op. Planning inside a generating process (sink threads, CUDA) therefore spawns."""
    import multiprocessing as mp
    import sys
    import threading

    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_initialized()
    safe = threading.active_count() == 1 and not cuda and "fork" in mp.get_all_start_methods()
    return "fork" if safe else "spawn"


@dataclass
class _Collected:
    """Every chunk's result, in dataset order (file, then line), and what they add up to."""

    results: List[ChunkResult] = field(default_factory=list)
    errors: List[RowError] = field(default_factory=list)
    rows: int = 0
    truncated: int = 0
    unknown: set = field(default_factory=set)

    @classmethod
    def of(cls, results: List[ChunkResult]) -> "_Collected":
        # Sorted by (file, chunk): a file read again row by row gets chunk indices after every
        # other file's, and this puts its rows back in their place in dataset order.
        col = cls(results=sorted(results, key=lambda r: (r.file, r.index)))
        for res in col.results:
            col.errors += res.errors
            col.truncated += res.truncated
            col.unknown |= res.unknown_fields
            col.rows += res.n_rows
        return col


def _spill_column(res: ChunkResult, name: str) -> np.ndarray:
    import pyarrow as pa

    with pa.memory_map(res.path) as src:
        reader = pa.ipc.open_file(src)
        parts = [reader.get_batch(b).column(name).to_numpy() for b in range(reader.num_record_batches)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


HASHES_PER_PASS = 64 << 20  # 512 MB of key hashes in memory at most


def _duplicates(col: _Collected, labels: List[str]) -> Dict[int, set]:
    """Rows whose key was already used by an earlier row: {chunk index: {line, ...}} to drop, with
    a RowError each (first occurrence in dataset order wins, as in load_dataset). The 64-bit key
    hashes are read back from the spill files, in passes over disjoint hash ranges, so memory stays
    bounded at any dataset size (one pass up to 64M rows). Cheap when there are none: one sort per pass."""
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
    seen: Dict[str, List[Tuple[int, int, ChunkResult]]] = {}  # key -> [(rank in dataset order, line, chunk)]
    for rank, res in enumerate(col.results):
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
                        seen.setdefault(k, []).append((rank, int(ln), res))
    drop: Dict[int, set] = {}
    for key, where in sorted(seen.items()):
        if len(where) < 2:
            continue  # a hash collision of distinct keys
        where.sort(key=lambda w: w[:2])
        _, first, first_res = where[0]
        for _, ln, res in where[1:]:
            if ln in drop.get(res.index, ()):
                continue  # the row's other samples (sampling.images_per_prompt): one error a row
            drop.setdefault(res.index, set()).add(ln)
            col.errors.append(RowError(labels[res.file], ln, key, _duplicate_reason(
                key, labels[first_res.file], first, labels[res.file], ln)))
    return drop


def _duplicate_reason(key: str, first_file: str, first: int, file: str, line: int) -> str:
    """A duplicate key's reason, as the dataset readers word it (rules.RowValidator): where both rows are
    keyless rows of files with one name stem (a/p.txt and b/p.txt), how to tell them apart."""
    stem = Path(file).stem
    if first_file != file and key == derived_key(stem, line) == derived_key(Path(first_file).stem, first):
        return keyless_collision(key, f"{first_file}:{first}", stem)
    return f"duplicate key {key!r} (first at {first_file}:{first})"


def _stream(tasks: Iterator[ChunkTask], workers: _Workers, t0: float, declined: Set[int]) -> List[ChunkResult]:
    """Every chunk through the processes, in order. A declined chunk adds its file to `declined`
    (the task stream then stops parsing that file); every result of a declined file is dropped."""
    out: List[ChunkResult] = []
    rows = 0
    ctx = workers.ctx
    assert ctx is not None  # built by _Workers.__enter__: _stream runs inside plan's `with _Workers(...)`
    # Closed on return: the pool's chunks still in flight are waited for.
    with closing(workers.map_ordered(lambda task: process_chunk(ctx, task), run_in_process, tasks)) as results:
        for res in results:
            if res.declined:
                declined.add(res.file)
                continue
            out.append(res)
            rows += res.n_rows
            if res.index % 50 == 49:
                log.info("planned %d rows (%.0f rows/s)", rows, rows / (time.perf_counter() - t0))
    kept = [r for r in out if r.file not in declined]
    for res in out:
        if res.file in declined and res.path:
            os.unlink(res.path)
    return kept


def _read_all(cfg: GenerateConfig, files: List[DatasetFile], workers: _Workers,
              t0: float) -> Tuple[_Collected, List[str]]:
    """Every file's chunks, in dataset order, and every file's sha256. JSONL goes through Arrow's fast
    lane in byte chunks (hashed as read); a file it declines, and every other format, row by row."""
    chunk_bytes = int(cfg.plan.chunk_mb * (1 << 20))
    index = itertools.count()  # chunk indices (spill file names), unique across files and passes
    stamps = [file_stat(f) for f in files]  # before a byte is read: see _check_unchanged
    hashes = {i: hashlib.sha256() for i, f in enumerate(files) if f.fmt == "jsonl"}
    declined: Set[int] = set()

    def fast_tasks() -> Iterator[ChunkTask]:
        for i, f in enumerate(files):
            if f.fmt == "jsonl":
                yield from _reading(f.path, _byte_chunks(f.path, i, chunk_bytes, hashes[i], index, declined,
                                                         stamps[i][0]))
            else:
                yield from _reading(f.path, _row_chunks(cfg, f.path, i, f.fmt, 20000, index))

    results = _stream(fast_tasks(), workers, t0, declined)
    for i in sorted(declined):  # the readers' rules decide
        log.info("%s: not plain LF-separated JSON objects throughout; reading it row by row", files[i].path)
    slow = (task for i in sorted(declined)
            for task in _reading(files[i].path, _row_chunks(cfg, files[i].path, i, "jsonl", 20000, index)))
    results += _stream(slow, workers, t0, set())
    digests = [hashes[i].hexdigest() if i in hashes else source_digest(cfg, f) for i, f in enumerate(files)]
    _check_unchanged(files, stamps)
    return _Collected.of(results), digests


def _check_unchanged(files: List[DatasetFile], stamps: List[Tuple[int, int]]) -> None:
    """Refuse a dataset file that changed while it was planned (a writer still appending). Its rows and its
    digest may then be of two versions, and plan.json's size and mtime, taken after, would say the file was
    planned whole: a rerun would trust them, and a row written meanwhile would never be planned."""
    for f, before in zip(files, stamps):
        after = file_stat(f)
        if after != before:
            raise DatasetError(f"dataset.path: {f.path} changed while it was planned ({before[0]} -> {after[0]} "
                               f"bytes, mtime moved {(after[1] - before[1]) / 1e9:+.3f} s): something is still "
                               f"writing it. Nothing was planned; rerun once it is written whole")


def _check(cfg: GenerateConfig, files: List[DatasetFile], label: str, workers: _Workers, t0: float):
    """Stream every chunk, then the whole-dataset checks: (collected, digests, seconds, drop, keep_until)."""
    col, digests = _read_all(cfg, files, workers, t0)
    labels = [str(f.path) for f in files]
    n_rows = col.rows
    if col.unknown:
        log.warning("%s: %s", label, unknown_fields_message(col.unknown, cfg.dataset.prompt_field,
                                                            cfg.dataset.key_field))
    streamed = time.perf_counter() - t0
    drop = _duplicates(col, labels)
    rank = {name: i for i, name in enumerate(labels)}
    col.errors.sort(key=lambda e: (rank.get(e.file, 0), e.line))  # dataset order: file, then line
    keep_until = _limit_line(col, drop, cfg.dataset.limit)
    n_valid = n_rows - sum(len(v) for v in drop.values())
    if not n_valid and not col.errors:
        raise DatasetError(f"dataset.path={label!r} holds no prompts (empty, or blank lines only)")
    if col.errors and cfg.dataset.on_error == "fail":
        raise DatasetError(format_row_errors(label, col.errors)
                           + "\nFix these rows, or set dataset.on_error=skip to generate the good rows "
                             "and write the bad ones to errors.jsonl in output_dir.", col.errors)
    if not n_valid:
        raise DatasetError(format_row_errors(label, col.errors)
                           + "\nEvery row is bad, so there is nothing to generate.", col.errors)
    return col, digests, streamed, drop, keep_until


def _n_workers(cfg: GenerateConfig, files: List[DatasetFile]) -> int:
    sizes = [file_stat(f)[0] for f in files]
    workers = cfg.plan.workers or os.cpu_count() or 1
    chunk_bytes = cfg.plan.chunk_mb * (1 << 20)
    if sum(sizes) <= chunk_bytes:
        return 1  # one chunk: starting processes would cost more than it saves
    if all(f.fmt == "jsonl" for f in files):  # byte chunks: a process per chunk at most (more would wait for nothing)
        return min(workers, sum(max(1, math.ceil(s / chunk_bytes)) for s in sizes))
    return workers


def plan_dataset(cfg: GenerateConfig, divisor: int, work_dir: Path) -> PlanResult:
    """Stream the dataset into `work_dir` (unit files); the caller publishes it as _plan/."""
    t0 = time.perf_counter()
    files = dataset_files(cfg)
    label = dataset_label(cfg.dataset, [f.path for f in files])
    spill = work_dir / SPILL_DIR
    spill.mkdir(parents=True)
    workers = _n_workers(cfg, files)
    initargs = (cfg, tuple((str(f.path), f.path.stem) for f in files), str(spill), divisor)
    with _Workers(workers, initargs) as pool:
        col, digests, streamed, drop, keep_until = _check(cfg, files, label, pool, t0)
        units, signatures, truncated = _write_units(col.results, drop, keep_until, cfg, work_dir, pool,
                                                    len(files) > 1)
    shutil.rmtree(spill)
    dataset = _dataset_record(cfg, files, digests, label)
    dataset.update(records=sum(u.count for u in units), bad_rows=len(col.errors), limit=cfg.dataset.limit)
    # Truncated among the planned items: rows past dataset.limit and dropped duplicates are not generated.
    manifest = PlanManifest(identity={}, dataset=dataset, unit_items=cfg.plan.unit_items, units=units,
                            truncated=truncated, signatures=signatures)
    seconds = time.perf_counter() - t0
    n_rows = dataset_rows(col, drop, cfg.sampling.images_per_prompt)
    log.info("plan: %d rows -> %d items in %d units of %d signatures, %d bad rows, %.1fs (%.0f rows/s, %d processes; "
             "streaming %.1fs, key check + units %.1fs)", n_rows, manifest.n_items, len(units),
             len(signatures), len(col.errors), seconds, n_rows / max(seconds, 1e-9), workers,
             streamed, seconds - streamed)
    return PlanResult(manifest=manifest, errors=col.errors, seconds=seconds)


def dataset_rows(col: _Collected, drop: Dict[int, set], images_per_prompt: int) -> int:
    """Rows read: the valid ones (a chunk counts each row's samples) and the bad ones, where a
    duplicate key is both a chunk's valid row and a bad row of the whole dataset: counted once."""
    duplicates = sum(len(lines) for lines in drop.values())
    return col.rows // images_per_prompt + len(col.errors) - duplicates


def _dataset_record(cfg: GenerateConfig, files: List[DatasetFile], digests: List[str], label: str) -> dict:
    """plan.json's `dataset`: one file as it always was (path, size, mtime, sha256), or the digest
    over every file and `files`, each file's record (its index there is what unit files hold)."""
    if len(files) == 1:
        f = files[0]
        size, mtime_ns = file_stat(f)
        return {"path": label, "format": f.fmt, "digest": digests[0], "bytes": size, "mtime_ns": mtime_ns}
    records = [file_record(f.path, d) for f, d in zip(files, digests)]
    return {"path": cfg.dataset.path, "format": "+".join(sorted({f.fmt for f in files})),
            "digest": dataset_digest(files, digests), "bytes": sum(r["bytes"] for r in records), "files": records}


def _limit_line(col: _Collected, drop: Dict[int, set], limit: int) -> Optional[Tuple[int, int]]:
    """dataset.limit = N: (file, line) of the N-th valid row (rows after it are validated, not planned)."""
    if not limit:
        return None
    seen = 0
    for res in col.results:
        # File order; np.unique: a row's samples (sampling.images_per_prompt) share its line
        lines: Union[np.ndarray, List[int]] = np.unique(_spill_column(res, "line")) if res.groups else []
        dropped = drop.get(res.index, ())
        for ln in lines:
            if ln in dropped:
                continue
            seen += 1
            if seen == limit:
                return res.file, int(ln)
    return None


def _pieces(results: List[ChunkResult]) -> Dict[tuple, List[Tuple[int, int]]]:
    by_sig: Dict[tuple, List[Tuple[int, int]]] = {}
    for ci, res in enumerate(results):
        for b, (sig, _) in enumerate(res.groups):
            by_sig.setdefault(sig, []).append((ci, b))
    return by_sig


@dataclass
class _UnitJob:
    """One unit file to write: its rows are slices of the signature's spill batches (filtered of
    dropped duplicates and rows past dataset.limit), in dataset order."""

    path: str
    sig_fields: tuple
    slices: List[Tuple[str, int, int, int, int]]  # (spill file, record batch, start, rows, file) after filtering
    drop: Dict[str, List[int]]  # spill file -> lines to leave out
    keep_until: Optional[Tuple[int, int]]
    file_column: bool = False  # several dataset files: each row records its file's index


def _filtered_batch(path: str, b: int, drop: List[int], keep_until: Optional[Tuple[int, int]], file: int):
    import pyarrow as pa
    import pyarrow.compute as pc

    with pa.memory_map(path) as src:
        batch = pa.ipc.open_file(src).get_batch(b)
    mask = None
    if drop:
        mask = pc.invert(pc.is_in(batch.column("line"), pa.array(sorted(drop), pa.int64())))
    if keep_until is not None and file >= keep_until[0]:  # files before the limit's are kept whole
        last = keep_until[1] if file == keep_until[0] else 0  # lines are >= 1: a later file keeps none
        m = pc.less_equal(batch.column("line"), last)
        mask = m if mask is None else pc.and_(mask, m)
    if mask is not None:
        batch = batch.filter(mask)
    return batch.drop_columns(["key_hash"])


def write_unit(job: _UnitJob) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    batches = [_filtered_batch(path, b, job.drop.get(path, []), job.keep_until, file).slice(start, n)
               for path, b, start, n, file in job.slices]
    table = pa.Table.from_batches(batches)
    for name, value in zip(SIGNATURE_COLUMNS, job.sig_fields):
        # pa.scalar infers the type a list of the value would get: int64, double, bool
        table = table.append_column(name, pa.repeat(pa.scalar(value), table.num_rows))
    if job.file_column:
        files = np.repeat([s[4] for s in job.slices], [len(b) for b in batches]).astype(np.int32)
        table = table.append_column(FILE_COLUMN, pa.array(files, pa.int32()))
    pq.write_table(table, job.path)


def _write_units(results: List[ChunkResult], drop: Dict[int, set], keep_until: Optional[Tuple[int, int]],
                 cfg: GenerateConfig, out: Path, workers: "_Workers",
                 file_column: bool) -> Tuple[List[UnitInfo], Dict[str, int], int]:
    """Cut each signature's run (in signature order) into equal units, numbered in that order; the
    files are written by all the processes. Also returns how many planned items were truncated."""
    drops = {results[ci].path: sorted(lines) for ci, lines in
             ((ci, drop.get(res.index)) for ci, res in enumerate(results)) if lines}
    affected = bool(drop) or keep_until is not None
    truncated = 0

    def rows(ci: int, b: int) -> int:
        nonlocal truncated
        res = results[ci]
        if not affected:
            return res.groups[b][1]
        batch = _filtered_batch(res.path, b, drops.get(res.path, []), keep_until, res.file)
        truncated += batch.column("truncated").to_numpy(zero_copy_only=False).sum()
        return batch.num_rows

    units: List[UnitInfo] = []
    jobs: List[_UnitJob] = []
    signatures: Dict[str, int] = {}
    by_sig = _pieces(results)
    for sig_fields in sorted(by_sig):
        pieces = [(results[ci].path, b, rows(ci, b), results[ci].file) for ci, b in by_sig[sig_fields]]
        sig = Signature(**dict(zip(SIGNATURE_COLUMNS, sig_fields)), dtype=cfg.model.dtype)
        n = sum(r for _, _, r, _ in pieces)
        if not n:
            continue
        signatures[str(sig)] = n
        k = math.ceil(n / cfg.plan.unit_items)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]  # equal units, no stub tail
        slices, have = [], 0
        for path, b, r, file in pieces:
            start = 0
            while start < r:
                take = min(r - start, sizes[0] - have)
                slices.append((path, b, start, take, file))
                start += take
                have += take
                if have == sizes[0]:
                    uid = len(units)
                    jobs.append(_UnitJob(path=str(out / f"{unit_name(uid)}.parquet"), sig_fields=sig_fields,
                                         slices=slices, drop={p: drops[p] for p, *_ in slices if p in drops},
                                         keep_until=keep_until, file_column=file_column))
                    units.append(UnitInfo(id=uid, signature=sig, count=have, cost=have * item_cost(sig)))
                    slices, have = [], 0
                    sizes.pop(0)
    for _ in workers.map_ordered(write_unit, write_unit, iter(jobs)):
        pass
    if not affected:
        truncated = sum(res.truncated for res in results)
    return units, signatures, int(truncated)
