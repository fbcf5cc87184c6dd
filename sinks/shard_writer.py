"""`ShardWriter`: a stream of samples -> a sequence of committed shards (webdataset's ShardWriter
with crash safety).

Rotation works like webdataset's: a shard is committed and the next opened when it holds
`maxcount` samples, or when the next sample would push its file past `maxsize` bytes (so shards
stay within maxsize unless one sample alone is larger). Each commit stages the shard's parquet and
stats (sinks/sidecars.py), seals the tar (closed, fsync'd, hashed), asks the `Owner`'s guard
whether it may still commit, writes the manifest (which lists them), links the tar to its final
name, publishes the sidecars, and then calls `on_commit(record)`.

The manifest goes before the tar, so a tar without a manifest was never this package's commit:
a scan that owns the names (sinks/owned_scan.py) leaves such a file alone and never adopts it. A
crash between the two leaves a manifest without its tar, which that scan removes.

Committed shards are never rewritten: an index whose final name (or temp name's final name) is
taken, e.g. by a previous run in the same output_dir, is skipped, also at the moment of the link.
Concurrent writers of one pattern (a stale worker and the one that took its unit over) never share
a temp file: each tags its temps (`Owner.temp_tag`: host, pid, lease).

A failing OS call (disk full, EIO) discards the partial shard and raises `SinkError`; the writer
then refuses further writes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn, Optional

from sinks.config import SinkConfig
from sinks.errors import SinkError
from sinks.manifest import ShardRecord, manifest_path, write_manifest
from sinks.sample import EncodedSample, Sample, encode_sample
from sinks.sidecars import MetaSpec, stage
from sinks.tar_shard import TarShard

log = logging.getLogger(__name__)

DEFAULT_NAME_PATTERN = "shard-{index:06d}.tar"


@dataclass(frozen=True)
class Owner:
    """Who writes: `run` goes into every manifest (a scan adopts only its own run's shards), `temp_tag`
    into every temp name, and `guard()` runs before each commit and raises to stop it (a job's
    worker that lost its lease on the names raises there, and commits nothing more)."""

    run: str = ""
    temp_tag: str = ""
    guard: Optional[Callable[[], None]] = None


def check_name_pattern(name_pattern: str) -> None:
    try:
        first, second = name_pattern.format(index=0), name_pattern.format(index=1)
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"shard name pattern {name_pattern!r} cannot be formatted with index ({err!r}); "
            f"use e.g. {DEFAULT_NAME_PATTERN!r}."
        ) from None
    if first == second or "/" in name_pattern or not first.endswith(".tar") or first.startswith("."):
        raise ValueError(
            f"shard name pattern {name_pattern!r} must contain {{index}}, end with .tar, "
            f"and have no '/' or leading '.'; "
            f"use e.g. {DEFAULT_NAME_PATTERN!r}."
        )


class ShardWriter:
    """Writes samples into rotating shards under `output_dir`, committing each atomically."""

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
        check_name_pattern(name_pattern)
        self.owner = owner
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.name_pattern = name_pattern
        self.on_commit = on_commit
        self.spec = spec
        self._failures_pending: dict = {}  # failures noted while no shard was open: the next one counts them
        self.records: list[ShardRecord] = []
        self.samples_written = 0
        self._next_index = start_index
        self._shard: TarShard | None = None
        self._failed: SinkError | None = None
        self._step = "starting"  # what the writer is doing, for error messages

    # -- public API -----------------------------------------------------------------------------

    def write(self, sample: Sample | EncodedSample) -> None:
        """Add one sample (a `Sample` is encoded here, on the calling thread)."""
        if self._failed is not None:
            raise SinkError(f"the sink already failed and accepts no more samples: {self._failed}")
        if isinstance(sample, Sample):
            sample = encode_sample(sample, self.config)
        try:
            if self._shard is not None and self._is_full_with(self._shard, sample):
                self._commit()
            if self._shard is None:
                path = self._free_path()
                self._step = f"opening shard {path.parent / ('.' + path.name + '.tmp')} (to become {path.name})"
                self._shard = TarShard(path, self.owner.temp_tag)
                self._shard.shard_log.failures.update(self._failures_pending)
                self._failures_pending = {}
            self._step = f"writing shard {self._shard.temp_path} (to become {self._shard.final_path.name})"
            self._shard.add(sample)
        except OSError as err:
            self._fail(err)
        self.samples_written += 1

    def note_failure(self, key: str, reason: str) -> None:
        """An item of this stretch that will not be written (e.g. a NaN image sent to a ledger): the
        open shard's stats count it (img2dataset's `failed_to_*`), or the next shard's if none is open."""
        if self._shard is not None:
            self._shard.shard_log.failures[reason] += 1
        else:
            self._failures_pending[reason] = self._failures_pending.get(reason, 0) + 1

    def commit_now(self) -> Optional[ShardRecord]:
        """Commit the current shard early (pre-emption); None when it holds no sample."""
        if self._failed is not None:
            raise SinkError(f"the sink already failed: {self._failed}")
        if self._shard is None:
            return None
        try:
            return self._commit()
        except OSError as err:
            self._fail(err)

    def close(self) -> list[ShardRecord]:
        """Commit the last shard; returns every record this writer committed."""
        self.commit_now()
        return list(self.records)

    def abort(self) -> None:
        """Drop the incomplete shard (no file is left under its names); committed shards stay."""
        if self._shard is not None:
            log.info("dropping incomplete shard %s (%d samples)", self._shard.final_path.name, self._shard.nsamples)
            self._shard.discard()
            self._shard = None

    @property
    def current_path(self) -> Optional[Path]:
        return None if self._shard is None else self._shard.final_path

    # -- internals ------------------------------------------------------------------------------

    def _is_full_with(self, shard: TarShard, sample: EncodedSample) -> bool:
        return shard.nsamples >= self.config.maxcount or shard.size_with(sample) > self.config.maxsize

    def _free_path(self) -> Path:
        while True:
            path = self.output_dir / self.name_pattern.format(index=self._next_index)
            self._next_index += 1
            # A manifest without its tar: the shard was uploaded (an object store, jobs/output/mirror.py).
            if not (path.exists() or manifest_path(self.output_dir, path.name).exists()):
                return path
            log.info("%s exists (committed by an earlier run); skipping to the next index", path.name)

    def _commit(self) -> ShardRecord:
        shard = self._shard
        assert shard is not None
        url = shard.final_path.name
        self._step = f"writing the parquet and stats of {url}"
        # Staged before the tar's commit and published after it: a sidecar is never without its shard.
        staged = stage(self.output_dir, url, shard.shard_log, shard.size_with(), self.spec,
                       temp_tag=self.owner.temp_tag)
        try:
            self._step = f"closing shard {shard.temp_path}"
            filesize, sha256, stamp = shard.seal()
            if self.owner.guard is not None:
                self.owner.guard()  # raises: this writer may no longer commit these names
            record = self._publish(shard, staged, filesize, sha256, stamp)
        except BaseException:
            staged.discard()
            raise  # on OSError the shard is still open, so _fail discards it
        self._shard = None
        self.records.append(record)
        if self.on_commit is not None:
            self.on_commit(record)
        return record

    def _publish(self, shard: TarShard, staged, filesize: int, sha256: str, stamp: str) -> ShardRecord:
        """Manifest, then the tar's link, then the sidecars. A name taken meanwhile (a writer this
        one cannot see committed it) moves the shard to the next free index instead of failing."""
        while True:
            mine = False
            url = shard.final_path.name
            stamps = {url: stamp, **staged.stamps()}
            record = ShardRecord(url, shard.nsamples, filesize, sha256, list(shard.keys), list(shard.members),
                                 [entry for *_, entry in staged.pairs], self.owner.run, stamps)
            self._step = f"writing the manifest of {url}"
            try:
                write_manifest(self.output_dir, record, exclusive=True, temp_tag=self.owner.temp_tag)
                mine = True
                self._step = f"committing shard {shard.temp_path} to {url}"
                shard.publish()
                break
            except FileExistsError:
                if mine:  # ours, exclusively created: the tar's name is another's
                    manifest_path(self.output_dir, url).unlink(missing_ok=True)
                log.warning("%s was committed by another writer meanwhile; this shard takes the next free name", url)
                new = self._free_path()
                staged.discard()  # the parquet names its shard: staged again under the new name
                staged = stage(self.output_dir, new.name, shard.shard_log, filesize, self.spec,
                               temp_tag=self.owner.temp_tag)
                shard.final_path = new
        self._step = f"publishing the parquet and stats of {url} (the shard itself is committed)"
        staged.publish()
        return record

    def _fail(self, err: OSError) -> NoReturn:
        self.abort()
        last = f", the last is {self.records[-1].url}" if self.records else ""
        self._failed = SinkError(
            f"{self._step} failed: {type(err).__name__}: {err}. No partial shard is left under a final name. "
            f"Committed shards are intact ({len(self.records)} committed by this writer{last}); "
            f"free space or fix the disk, then rerun the same command to resume."
        )
        raise self._failed from err
