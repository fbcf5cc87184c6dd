"""What the plan records of the files it was made from, and how a rerun checks them cheaply.

    record = file_record(path)                      {"path", "bytes", "mtime_ns", "digest"} (sha256)
    digest = digest_if_changed(path, record)        record["digest"] while size and mtime match, else sha256

A dataset (one file, a folder, a brace list) and the weights under `model.path` are both checked
this way when a job joins a run: one stat a file, and a file is read again only when its size or
mtime moved (a touch, a copy, an edit), so joining a run of a 40 GB checkpoint or a 10M-prompt
dataset reads nothing when nothing changed. A moved mtime with the same bytes gives the same
digest: it is hashed, then accepted.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Iterable, Optional, Tuple

log = logging.getLogger("jobs.plan")

BLOCK = 1 << 22  # 4 MiB reads: a checkpoint is hashed at disk speed without holding it in memory


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def file_record(path: Path, digest: Optional[str] = None, name: Optional[str] = None) -> dict:
    """`path`'s size, mtime and sha256 (hashed here unless the caller already has it), under `name`."""
    st = os.stat(path)
    return {"path": name if name is not None else str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "digest": digest if digest is not None else file_digest(path)}


def unchanged(path: Path, record: Optional[dict]) -> bool:
    """Size and mtime are the recorded ones (one stat, no byte read)."""
    if not record:
        return False
    st = os.stat(path)
    return record.get("bytes") == st.st_size and record.get("mtime_ns") == st.st_mtime_ns


def digest_if_changed(path: Path, record: Optional[dict], what: str) -> str:
    """The recorded digest while the file looks unchanged, else its sha256 (logged: it reads the file)."""
    if record is not None and unchanged(path, record):  # unchanged() is False without a record anyway
        return record["digest"]
    if record:
        log.info("%s %s changed size or mtime since it was planned: hashing it to compare", what, path)
    return file_digest(path)


def combined_digest(parts: Iterable[Tuple[str, str]]) -> str:
    """One digest of many files: sha256 over `name<TAB>digest` lines in the given order. Names are
    part of it because they decide derived keys (a dataset) or which component a file is (weights)."""
    return hashlib.sha256("".join(f"{name}\t{digest}\n" for name, digest in parts).encode()).hexdigest()
