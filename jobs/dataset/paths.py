"""What files `dataset.path` names: one file, a directory, or a brace list.

    prompts.jsonl                    one file
    /data/prompts/                   every file directly inside, by sorted name (hidden files skipped;
                                     with dataset.format=auto, only known extensions)
    /data/prompts-{000..099}.jsonl   a brace list (braceexpand, as webdataset expands shard urls)

Files are read in sorted order, so keys and the plan do not depend on the order the filesystem
lists them in, and every file of a list must exist: a missing shard of a prompt set is an error,
not a silently smaller job.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, List

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
        missing = [str(f) for f in files if not f.exists()]
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
    names = sorted(p.name for p in directory.iterdir() if not p.name.startswith(".") and p.is_file())
    files = [directory / n for n in names if any_extension or n.lower().endswith(extensions)]
    if not files:
        what = "files" if any_extension else f"files ending in {', '.join(extensions)}"
        raise DatasetError(f"dataset.path={str(directory)!r} is a directory with no {what}; "
                           f"point dataset.path at a prompt file, a folder of them, or a brace list")
    return files


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
        # /dev/zero or a disk: endless or huge, never a prompt file. Pipes (FIFOs) are allowed.
        raise DatasetError(f"dataset.path={path_text!r}: {path} is a device, not a file of prompts; "
                           f"give a JSONL, TXT, CSV, Parquet or tar file")
