"""What files `dataset.path` names: one file, a directory, or a brace list.

    prompts.jsonl                    one file
    /data/prompts/                   every file directly inside, by sorted name (hidden files skipped;
                                     with dataset.format=auto, only known extensions; a link to a file
                                     that is gone is refused, not skipped)
    /data/prompts-{000..099}.jsonl   a brace list (braceexpand, as webdataset expands shard urls)

Files are read in sorted order, so keys and the plan do not depend on the order the filesystem
lists them in, and every file of a list must exist: a missing shard of a prompt set is an error,
not a silently smaller job.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, List, Optional

from jobs.dataset.rules import DatasetError

SHOWN = 5


def dataset_files(path_text: str, extensions: Iterable[str], any_extension: bool) -> List[Path]:
    """The files `path_text` names, sorted; DatasetError naming what is missing or unreadable."""
    if "{" in path_text:
        from braceexpand import braceexpand

        try:
            names = sorted(set(braceexpand(path_text)))
        except Exception as exc:  # noqa: BLE001 - braceexpand raises plain errors on a malformed pattern
            raise DatasetError(f"dataset.path={path_text!r} is not a valid brace list ({exc}); "
                               f"write e.g. prompts-{{000..099}}.jsonl") from None
        files = [Path(n) for n in names]
        missing = [str(f) + _link_note(f) for f in files if not f.exists()]
        if missing:
            raise DatasetError(f"dataset.path={path_text!r} names {len(files)} files and {len(missing)} do not exist: "
                               f"{', '.join(missing[:SHOWN])}{' ...' if len(missing) > SHOWN else ''} (working "
                               f"directory {os.getcwd()}); fix the range, or create the files")
        for f in files:
            check_file(f, path_text)
        return files
    path = Path(path_text)
    if path.is_dir():
        return _directory_files(path, tuple(extensions), any_extension)
    return [path]


def _directory_files(directory: Path, extensions: tuple, any_extension: bool) -> List[Path]:
    entries = sorted((p for p in directory.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)
    wanted = [p for p in entries if any_extension or p.name.lower().endswith(extensions)]
    for p in wanted:
        # is_file() is False for a link to nothing: skipping it would make the dataset silently smaller.
        target = broken_link(p)
        if target is not None:
            raise DatasetError(f"dataset.path={str(directory)!r}: {p} is a symbolic link to {target!r}, which "
                               f"does not exist (moved or deleted, or links that loop); every file of the folder "
                               f"is the dataset. Point the link at the file, or remove it")
    files = [p for p in wanted if p.is_file()]
    if not files:
        what = "files" if any_extension else f"files ending in {', '.join(extensions)}"
        raise DatasetError(f"dataset.path={str(directory)!r} is a directory with no {what}; "
                           f"point dataset.path at a prompt file, a folder of them, or a brace list")
    return files


def broken_link(path: Path) -> Optional[str]:
    """Where `path` points (as the link says it) if it is a symbolic link to nothing, else None."""
    try:
        return os.readlink(path) if path.is_symlink() and not path.exists() else None
    except OSError:
        return None


def _link_note(path: Path) -> str:
    """` (a symbolic link to 'x', which does not exist)` for a link to nothing: the name alone looks like a file."""
    target = broken_link(path)
    return "" if target is None else f" (a symbolic link to {target!r}, which does not exist)"


def check_file(path: Path, path_text: str) -> None:
    """Refuse what is not a file of prompts before reading a byte of it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise DatasetError(f"dataset.path={path_text!r}: cannot read {path}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise DatasetError(f"dataset.path={path_text!r}: {path} is a directory inside a file list; "
                           f"name files only")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        # /dev/zero or a disk: endless or huge, never a prompt file.
        raise DatasetError(f"dataset.path={path_text!r}: {path} is a device, not a file of prompts; "
                           f"give a JSONL, TXT, CSV, Parquet or tar file")
    if not stat.S_ISREG(mode):
        # A FIFO or socket can be read once only, and the plan reads a dataset twice (its digest and
        # its rows, and again to check a resume): refused before a byte is read, rather than hang.
        raise DatasetError(f"dataset.path={path_text!r}: {path} is a pipe or socket, not a regular file: the job "
                           f"reads its dataset more than once (to plan, to hash, to resume). Save the stream to a "
                           f"file first (e.g. `cat ... > prompts.jsonl`) and point dataset.path at it")
    check_compression(path, path_text)


# Magic numbers of compressed files: a compressed prompt file is refused naming its compression.
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -k"), (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"),
               (b"BZh", "bzip2", "bunzip2 -k"), (b"\xfd7zXZ\x00", "xz", "unxz -k"))
_WDS_COMPRESSED = (".tgz", ".tar.gz")  # a gzipped webdataset tar is read as it is (tarfile's r|*)


def check_compression(path: Path, path_text: str) -> None:
    """A gzip/zstd/bzip2/xz file is refused, naming the compression and the command that undoes it
    (its text would otherwise be read as garbage rows, or "re-encode as UTF-8")."""
    if path.name.lower().endswith(_WDS_COMPRESSED):
        return
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return
    for magic, name, undo in _COMPRESSED:
        if head.startswith(magic):
            raise DatasetError(f"dataset.path={path_text!r}: {path} is {name}-compressed; the job reads plain "
                               f"JSONL, TXT, CSV, Parquet or tar files. Decompress it first (`{undo} {path}`) and "
                               f"point dataset.path at the result")
