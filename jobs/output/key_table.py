"""`KeyTable`: two outputs' keys in a SQLite file on disk, so `jobs.verify --against` holds no run in memory.

A run can have 10M samples; a Python dict of each key's digests would take several GB. Each side's rows
(key, its digest bundle as text, the shard it was read from) go into a table of their own, inserted in
batches, and the categories are SQL over them: the rows come back through cursors, and what a caller
keeps is a count and the first `shown` keys of each category (`Keys`), sorted by key.

A key read twice on one side (two shards hold it) is a duplicate; the side is compared by the copy read
first (the lowest rowid), as a reader that keeps the first of each key would see it. The bundle is opaque
here: two keys are identical when their bundles are equal text, so the caller gives canonical text (e.g.
JSON with sorted keys). The file is the caller's to place and remove (a temporary folder).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Tuple

SIDES = ("here", "there")  # table names come from here only: nothing a user typed goes into SQL text
BATCH = 10_000  # rows per executemany and commit: bounded memory, few transactions
CACHE_KIB = 32 * 1024  # SQLite's page cache (its own memory, outside Python's): large enough for the index builds
# The keys both sides have, each with the bundle of its first copy on either side (x: here's, y: there's)
BOTH = ("FROM first_here a JOIN first_there b ON a.key = b.key "
        "JOIN rows_here x ON x.rowid = a.row JOIN rows_there y ON y.rowid = b.row")


@dataclass(frozen=True)
class Keys:
    """A category of keys: how many, and the first few of them in sorted order."""

    count: int = 0
    first: Tuple[str, ...] = ()

    def __len__(self) -> int:  # so `len(keys)` and `if keys:` read as they did of a list
        return self.count


class KeyTable:
    """Rows of two sides in `folder/keys.sqlite`; `add` them, `seal` each side, then ask."""

    def __init__(self, folder: Path, shown: int = 5) -> None:
        self.shown = shown
        self.db = sqlite3.connect(str(Path(folder) / "keys.sqlite"))
        # A scratch file, rebuilt on any rerun: no journal and no fsync (a crash only loses the scratch).
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        self.db.execute("PRAGMA temp_store=FILE")  # sorts spill to disk, not to memory
        for side in SIDES:
            # rowid is the read order: the first copy of a duplicated key is the one compared
            self.db.execute(f"CREATE TABLE rows_{side} (key TEXT NOT NULL, bundle TEXT NOT NULL, shard TEXT NOT NULL)")
        self.db.commit()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> KeyTable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, side: str, rows: Iterable[Tuple[str, str, str]]) -> int:
        """Insert (key, bundle, shard) rows, BATCH at a time; how many were added."""
        sql = f"INSERT INTO rows_{_table(side)} (key, bundle, shard) VALUES (?, ?, ?)"
        batch: List[Tuple[str, str, str]] = []
        added = 0
        for row in rows:
            batch.append(row)
            if len(batch) >= BATCH:
                added += self._insert(sql, batch)
                batch = []
        return added + self._insert(sql, batch)

    def _insert(self, sql: str, batch: List[Tuple[str, str, str]]) -> int:
        with self.db:  # one transaction a batch
            self.db.executemany(sql, batch)
        return len(batch)

    def seal(self, side: str) -> None:
        """Index the side by key and note its first copy of each key (`first_SIDE`: key -> that row's
        rowid, not a second copy of the bundle, which would double the file), after its last add."""
        side = _table(side)
        with self.db:
            self.db.execute(f"CREATE INDEX rows_{side}_key ON rows_{side} (key)")
            self.db.execute(f"CREATE TABLE first_{side} (key TEXT PRIMARY KEY, row INTEGER NOT NULL) WITHOUT ROWID")
            self.db.execute(f"INSERT INTO first_{side} SELECT key, MIN(rowid) FROM rows_{side} GROUP BY key")

    # -- the categories (after both sides are sealed) ---------------------------------------------

    def duplicates(self, side: str) -> Keys:
        """Keys read more than once on `side`, once per copy after the first (a key in three shards
        counts twice), as the reader that met them one by one counted them."""
        side = _table(side)
        cur = self.db.execute(f"SELECT key, COUNT(*) - 1 FROM rows_{side} GROUP BY key HAVING COUNT(*) > 1 "
                              f"ORDER BY key")
        count = 0
        first: List[str] = []
        for key, extra in cur:
            count += extra
            first.extend([key] * min(extra, self.shown - len(first)))
        return Keys(count, tuple(first))

    def identical(self) -> Keys:
        return self._keys(f"{BOTH} WHERE x.bundle = y.bundle")

    def differing(self) -> Tuple[Keys, List[Tuple[str, str, str]]]:
        """Keys on both sides with other bundles, and (key, bundle here, bundle there) of the first."""
        where = f"{BOTH} WHERE x.bundle <> y.bundle"
        (count,) = self.db.execute(f"SELECT COUNT(*) {where}").fetchone()
        first = self.db.execute(f"SELECT a.key, x.bundle, y.bundle {where} ORDER BY a.key LIMIT ?",
                                (self.shown,)).fetchall()
        return Keys(count, tuple(k for k, _, _ in first)), first

    def only(self, side: str) -> Keys:
        """Keys that `side` has and the other side has not."""
        a = _table(side)
        b = SIDES[1 - SIDES.index(a)]
        return self._keys(f"FROM first_{a} a LEFT JOIN first_{b} b ON a.key = b.key WHERE b.key IS NULL")

    def _keys(self, where: str) -> Keys:
        (count,) = self.db.execute(f"SELECT COUNT(*) {where}").fetchone()
        first = self.db.execute(f"SELECT a.key {where} ORDER BY a.key LIMIT ?", (self.shown,))
        return Keys(count, tuple(k for (k,) in first))


def _table(side: str) -> str:
    if side not in SIDES:
        raise ValueError(f"side {side!r}: one of {SIDES}")
    return side
