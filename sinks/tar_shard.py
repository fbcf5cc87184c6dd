"""`TarShard`: writes ONE shard under a temp name and commits it to its final name.

Invariant: a file under a final shard name is a complete tar. The shard is written to
`.NAME.tmp` in the same directory, closed, flushed and fsync'd, then linked to `NAME` (a hard
link fails if `NAME` exists, so a committed shard is never replaced, not even by a racing
writer), the temp name is removed, and the directory is fsync'd so the new name survives a
power loss. A crash at any instant leaves at most a temp file, which `scan_output` deletes.

Bytes are deterministic: fixed mtime, uid/gid, owner names and mode in every header, USTAR
format, members in write order; the same samples give a byte-identical shard.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from pathlib import Path

from sinks.atomic import fsync_dir, link_no_replace, temp_path_for
from sinks.sample import EncodedSample
from sinks.sidecars import Row, ShardLog
from sinks.tar_check import file_stamp

log = logging.getLogger(__name__)

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_MTIME = 0
_MODE = 0o444
_OWNER = "bcgen"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def member_bytes(payload_len: int) -> int:
    """Bytes a member takes in a USTAR archive: one header block plus padded data."""
    return _BLOCK + _round_up(payload_len, _BLOCK)


def closed_size(offset: int) -> int:
    """File size after close: two zero blocks end the archive, then padding to a full record."""
    return _round_up(offset + 2 * _BLOCK, _RECORD)


class _HashingFile:
    """The temp file, hashing what tarfile writes so commit needs no second read."""

    def __init__(self, f: io.BufferedWriter) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self._f.write(data)

    def tell(self) -> int:
        return self._f.tell()


class TarShard:
    """An open shard: `add` samples, then `commit` (final name) or `discard` (nothing left)."""

    def __init__(self, final_path: Path, temp_tag: str = "") -> None:
        self.final_path = Path(final_path)
        self.temp_path = temp_path_for(self.final_path, temp_tag)
        self.keys: list[str] = []
        self.members: list[list] = []  # [name, payload size]: the manifest's witness of this tar's headers
        self._stems: set[str] = set()
        self.shard_log = ShardLog()  # rows and failures for the shard's parquet and stats (sinks/sidecars.py)
        # "wb", not "xb": a leftover temp of the same name is a dead run's partial shard.
        self._file = open(self.temp_path, "wb")
        self._hashing = _HashingFile(self._file)
        # typeshed's _Fileobj also asks for read/seek/close, which tarfile's "w" mode never calls.
        self._tar = tarfile.open(fileobj=self._hashing, mode="w",  # type: ignore[call-overload]  # typeshed _Fileobj
                                 format=tarfile.USTAR_FORMAT)

    @property
    def nsamples(self) -> int:
        return len(self.keys)

    def size_with(self, sample: EncodedSample | None = None) -> int:
        """The committed file size now, or after adding `sample`."""
        extra = 0 if sample is None else sum(member_bytes(len(data)) for _, data in sample.members())
        return closed_size(self._tar.offset + extra)

    def add(self, sample: EncodedSample) -> None:
        if sample.stem in self._stems:
            # Same stem twice in one tar: readers would merge or drop samples.
            raise ValueError(f"sample key {sample.key!r} was written twice to {self.final_path.name}; "
                             f"keys must be unique.")
        members = sample.members()
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = _MTIME
            info.mode = _MODE
            info.uid = info.gid = 0
            info.uname = info.gname = _OWNER
            self._tar.addfile(info, io.BytesIO(data))
            self.members.append([name, len(data)])
        self._stems.add(sample.stem)
        self.keys.append(sample.key)
        self.shard_log.rows.append(Row(sample.key, json.loads(sample.meta_json), [n for n, _ in members],
                                 sum(len(d) for _, d in members)))

    def seal(self) -> tuple[int, str, str]:
        """Close and fsync the temp file (nothing visible yet); returns (filesize, sha256 hex, stamp):
        the final file will have this size, hash and stamp (a link keeps the mtime)."""
        assert self.keys, "an empty shard is never committed"
        expected = self.size_with()  # before close: close moves the offset past the end blocks
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        st = os.stat(self.temp_path)
        assert st.st_size == expected, (st.st_size, expected)  # the maxsize rotation relies on it
        return st.st_size, self._hashing.sha256.hexdigest(), file_stamp(st)

    def publish(self, final_path: Path | None = None) -> None:
        """Link the sealed temp to its final name (FileExistsError when the name is taken)."""
        if final_path is not None:
            self.final_path = Path(final_path)
        link_no_replace(self.temp_path, self.final_path)
        fsync_dir(self.final_path.parent)
        log.debug("committed %s: %d samples", self.final_path, self.nsamples)

    def commit(self) -> tuple[int, str]:
        """Make the shard visible under its final name; returns (filesize, sha256 hex)."""
        filesize, sha256, _ = self.seal()
        self.publish()
        return filesize, sha256

    def discard(self) -> None:
        """Drop the partial shard; never raises (it runs on error paths)."""
        for close in (self._tar.close, self._file.close):
            try:
                close()
            except Exception:  # noqa: BLE001 - the disk may be full or gone; removal is what matters
                pass
        try:
            self.temp_path.unlink(missing_ok=True)
        except OSError as err:
            log.warning("could not remove partial shard %s (%s); a resumed run's scan removes it", self.temp_path, err)
