"""The files a look wrote into its folder, recorded there, so that the next look into the same folder
replaces them instead of leaving its own beside the old ones.

    FOLDER/.inspect-files    one name a line, relative to FOLDER: every file the last look wrote there

Without it a second `jobs.inspect --pages` into a folder (fewer samples, other keys, another filter)
left the first one's pages and images beside its own: page-0004.html of a run that now has one page,
images of samples the output no longer holds. A look names each file in the record before it writes
it (appended, so memory holds no list of a whole run), then removes the files that earlier looks
recorded and it did not write again, and replaces the record with its own names. A look killed midway
leaves a record of both, so the next one still removes them. A file no record names (someone's own, or
one written before inspect kept records) is never removed; a recorded name that is not a plain path
inside the folder (a hand-edited record) is never followed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath
from typing import Dict, List, Set

log = logging.getLogger("jobs.inspect")

RECORD = ".inspect-files"


class WrittenFiles:
    """`with WrittenFiles(folder) as files: files.path("images/k.jpg").write_bytes(...)`; on a clean exit the
    earlier looks' files this one did not write are removed. An exception leaves every file and the record
    (old names and new) as they are."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.earlier = _read(self.folder / RECORD)
        self.now: Dict[str, None] = {}  # an ordered set: the record lists names in the order written
        self.removed: List[str] = []

    def __enter__(self) -> WrittenFiles:
        self._record = open(self.folder / RECORD, "a", encoding="utf-8")
        return self

    def path(self, name: str) -> Path:
        """Where to write `name` (relative to the folder, `/`-separated), recorded before it is written."""
        assert _plain(name) and name != RECORD, name
        if name not in self.now:
            self.now[name] = None
            self._record.write(name + "\n")
            self._record.flush()  # on disk before the file is: a kill between the two still leaves it named
        return self.folder / name

    def __exit__(self, kind, value, tb) -> None:
        self._record.close()
        if kind is not None:
            return
        root = self.folder.resolve()
        for name in sorted(self.earlier - self.now.keys()):
            path = self.folder / name
            # A recorded folder name swapped for a link (images -> elsewhere) must not carry a removal out.
            if path.parent.resolve().is_relative_to(root) and (path.is_file() or path.is_symlink()):
                path.unlink()
                self.removed.append(name)
        tmp = self.folder / f"{RECORD}.tmp"
        tmp.write_text("".join(f"{n}\n" for n in self.now), encoding="utf-8")
        os.replace(tmp, self.folder / RECORD)
        if self.removed:
            log.info("%s: removed %d file(s) an earlier look wrote there and this one did not (e.g. %s)",
                     self.folder, len(self.removed), self.removed[0])


def _plain(name: str) -> bool:
    """A relative path inside the folder: no root, no `..`, no empty or `.` part, `/`-separated."""
    parts = PurePosixPath(name).parts
    return (bool(name) and "\\" not in name and "\n" not in name and not name.startswith("/")
            and all(p not in ("", ".", "..") for p in parts) and "/".join(parts) == name)


def _read(record: Path) -> Set[str]:
    """The names earlier looks recorded; plain ones only (anything else is not followed, nor removed)."""
    try:
        lines = record.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return set()
    return {n for n in lines if _plain(n) and n != RECORD}
