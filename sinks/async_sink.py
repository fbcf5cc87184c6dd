"""`AsyncSink`: samples encoded and tar shards written off the caller's (generation) thread.

    put(sample) ──▶ [encode pool: `encode_threads` threads] ──futures──▶ bounded queue
                                                                         │ (in put order)
                                                                         ▼
                                                     ONE writer thread ──▶ ShardWriter

`put` checks the sample, submits its payloads to the encode pool and enqueues the future; the
queue holds at most `queue_size` samples, so a slow disk blocks `put` (backpressure) instead of
growing memory. The writer thread takes futures in submission order and waits on each, so the
shards' content is the order of `put` calls whatever order the encoders finish in: same
input, same bytes.

Failures: an error on the writer thread (disk full, EIO, an encoder crash) is stored, the partial
shard is removed, later items are drained unwritten, and the next `put`/`commit_now`/`close`
raises `SinkError`. Committed shards are never touched.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from sinks.config import SinkConfig
from sinks.errors import CommitRefused, SinkError
from sinks.manifest import ShardRecord
from sinks.sample import EncodedSample, PreparedSample, Sample, prepare_sample
from sinks.shard_writer import DEFAULT_NAME_PATTERN, Owner, ShardWriter
from sinks.sidecars import MetaSpec

log = logging.getLogger(__name__)


@dataclass
class _Write:
    sample: PreparedSample
    encoded: Future  # -> EncodedSample


@dataclass
class _Failure:
    key: str
    reason: str


@dataclass
class _Commit:
    done: threading.Event
    record: Optional[ShardRecord] = None


_STOP = object()


class AsyncSink:
    """Threaded front of `ShardWriter`; use as a context manager or call `close`/`abort`."""

    def __init__(
        self,
        output_dir: str | Path,
        config: SinkConfig,
        name_pattern: str = DEFAULT_NAME_PATTERN,
        start_index: int = 0,
        on_commit: Optional[Callable[[ShardRecord], None]] = None,
        spec: MetaSpec = MetaSpec(),  # noqa: B008 (frozen dataclass: one shared default is safe)
        owner: Owner = Owner(),  # noqa: B008 (frozen dataclass: one shared default is safe)
    ) -> None:
        self.config = config
        self._writer = ShardWriter(output_dir, config, name_pattern, start_index, on_commit, spec, owner)
        self._queue: queue.Queue = queue.Queue(maxsize=config.queue_size)
        self._pool = ThreadPoolExecutor(config.encode_threads, thread_name_prefix="sink-encode")
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._aborting = False
        self._closed = False
        self._encode_s = 0.0
        self._write_s = 0.0
        self._put_blocked_s = 0.0
        # daemon: a caller that dies without close() must not hang interpreter exit; the partial
        # shard it leaves is a temp file that the next scan_output removes.
        self._thread = threading.Thread(target=self._run, name="sink-writer", daemon=True)
        self._thread.start()

    # -- caller side ----------------------------------------------------------------------------

    def put(self, sample: Sample) -> None:
        """Enqueue one sample; blocks while `queue_size` samples are pending; ValueError on bad input."""
        self._check_usable()
        prepared = prepare_sample(sample, self.config.format)
        future = self._pool.submit(self._encode, prepared)
        t0 = time.perf_counter()
        self._queue.put(_Write(prepared, future))
        self._put_blocked_s += time.perf_counter() - t0

    def note_failure(self, key: str, reason: str) -> None:
        """An item that will not be written (ShardWriter.note_failure), in put order."""
        self._check_usable()
        self._queue.put(_Failure(key, reason))

    def commit_now(self) -> Optional[ShardRecord]:
        """Write everything put so far and commit the current shard now (pre-emption: commit what
        is complete, then exit). Returns the committed record, or None if the shard was empty."""
        self._check_usable()
        request = _Commit(threading.Event())
        self._queue.put(request)
        request.done.wait()
        self._raise_if_failed()
        return request.record

    flush = commit_now

    def close(self) -> list[ShardRecord]:
        """Drain, commit the last shard, stop the threads; returns every committed record."""
        if not self._closed:
            self._closed = True
            self._shutdown()
        self._raise_if_failed()
        return list(self._writer.records)

    def abort(self) -> None:
        """Stop now (Ctrl-C): pending samples are dropped, the incomplete shard is removed,
        committed shards stay. Safe to call more than once and after an error."""
        if self._closed:
            return
        self._closed = True
        self._aborting = True
        self._shutdown()

    @property
    def records(self) -> list[ShardRecord]:
        return list(self._writer.records)

    def stats(self) -> dict:
        """Counters for the job summary."""
        with self._lock:
            encode_s = self._encode_s
        return {
            "samples": sum(r.nsamples for r in self._writer.records),
            "shards": len(self._writer.records),
            "bytes": sum(r.filesize for r in self._writer.records),
            "encode_seconds": round(encode_s, 6),
            "write_seconds": round(self._write_s, 6),
            # time put() waited on a full queue: > 0 means the sink, not the generator, was the bottleneck
            "put_blocked_seconds": round(self._put_blocked_s, 6),
        }

    def __enter__(self) -> "AsyncSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _check_usable(self) -> None:
        self._raise_if_failed()  # the failure is the news, even after close()
        if self._closed:
            raise RuntimeError("the sink is closed (close() or abort() was called); create a new AsyncSink.")

    def _raise_if_failed(self) -> None:
        if isinstance(self._error, CommitRefused):
            raise self._error
        if self._error is not None:
            # A fresh exception so the caller's traceback shows its own put/close; the cause chain
            # keeps the writer thread's original error.
            raise SinkError(str(self._error)) from self._error

    def _shutdown(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- encode threads -------------------------------------------------------------------------

    def _encode(self, sample: PreparedSample) -> EncodedSample:
        t0 = time.perf_counter()
        data = sample.encoded(self.config)
        with self._lock:
            self._encode_s += time.perf_counter() - t0
        return data

    # -- writer thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if self._error is not None or self._aborting:
                self._skip(item)
                continue
            try:
                self._handle(item)
            except BaseException as err:  # noqa: BLE001 - stored and re-raised on the caller's thread
                self._fail(err, item)
        try:
            if self._aborting or self._error is not None:
                self._writer.abort()
            else:
                self._timed(self._writer.close)
        except BaseException as err:  # noqa: BLE001
            self._fail(err, None)

    def _handle(self, item: object) -> None:
        if isinstance(item, _Write):
            self._timed(self._writer.write, item.encoded.result())
        elif isinstance(item, _Failure):
            self._writer.note_failure(item.key, item.reason)
        else:
            assert isinstance(item, _Commit), item
            item.record = self._timed(self._writer.commit_now)
            item.done.set()

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._write_s += time.perf_counter() - t0

    def _fail(self, err: BaseException, item: object) -> None:
        if self._error is None:
            self._error = err if isinstance(err, (SinkError, CommitRefused)) else self._describe(err)
            if not isinstance(err, CommitRefused):  # the caller says why it stopped, once
                log.error("%s", self._error)
        self._writer.abort()
        self._skip(item)

    def _describe(self, err: BaseException) -> SinkError:
        shard = self._writer.current_path
        error = SinkError(
            f"the sink failed while writing {shard.name if shard else 'a shard'}: {type(err).__name__}: {err}. "
            f"No partial shard is left under a final name; committed shards are intact and the run can be "
            f"resumed by rerunning the same command."
        )
        error.__cause__ = err
        return error

    @staticmethod
    def _skip(item: object) -> None:
        if isinstance(item, _Write):
            item.encoded.cancel()
        elif isinstance(item, _Commit):
            item.done.set()  # never leave commit_now waiting
