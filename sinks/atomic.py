"""Crash-safe small-file writes: temp name in the same directory, fsync, rename, fsync the directory.

A reader (or a resumed run) sees either the old file or the complete new one, never a torn one.
The directory fsync makes the rename itself durable: without it a power loss can forget it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Filesystems without hard links (some FUSE/object-store mounts): fall back to check + rename.
_NO_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV}


def temp_path_for(path: Path, tag: str = "") -> Path:
    """`DIR/.NAME.tmp` (or `DIR/.NAME.TAG.tmp`): hidden and suffixed, so no `shard-*.tar` or `*.json`
    glob matches it. A tag unique per writer (host, pid, lease) keeps two writers of one name (a
    stale one that lost its lease and its successor) from ever opening, or deleting, each other's."""
    return path.with_name(f".{path.name}.{tag}.tmp" if tag else f".{path.name}.tmp")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it: durable before any rename or link publishes it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (an existing file is replaced as a whole)."""
    path = Path(path)
    tmp = temp_path_for(path)
    try:
        write_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def link_no_replace(src: Path, dst: Path) -> None:
    """Publish `src` as `dst` unless `dst` exists (FileExistsError); `src` is gone afterwards."""
    try:
        os.link(src, dst)
    except OSError as err:
        if err.errno not in _NO_LINK_ERRNOS:
            raise
        # Not atomic against a racing writer: callers keep names unique per writer (shards) or hold a
        # lock (run.json's claim).
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "the final name already exists", str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)
