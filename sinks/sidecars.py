"""Per-shard metadata you can query: `NAME.parquet` and `NAME_stats.json` beside `NAME.tar`.

img2dataset's layout (`00000.tar`, `00000.parquet`, `00000_stats.json` side by side), with this
package's shard names:

    shard-u0000003-0000.tar            the samples (webdataset)
    shard-u0000003-0000.parquet        one row per sample: key, shard, the caller's columns, members, bytes
    shard-u0000003-0000_stats.json     count, successes, failures, bytes, start/end time, duration, tallies

The parquet's columns are fixed by a `MetaSpec` the caller gives (an Arrow schema for the fields
of each sample's json it wants as columns), so every shard of a run has the same schema and
`duckdb`'s `read_parquet('OUT/*.parquet')` or `pyarrow.dataset` read the run as one table. The
sink knows nothing of diffusion: the columns are whatever the caller's samples carry in their json.

Commit order (sinks/shard_writer.py): both files are written to temp names and fsync'd, the tar
is committed, then they are renamed to their final names, then the manifest, which lists them
(name, size, sha256), is written. So a sidecar under a final name always has its shard: a crash
leaves temps (removed by the resume scan) or a committed shard without sidecars, which the scan
rebuilds from the tar's jsons (the stats then say `"rebuilt": true`, with no times).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PARQUET_SUFFIX = ".parquet"
STATS_SUFFIX = "_stats.json"
Sidecar = List  # [name, size, sha256]


def _pa():
    import pyarrow as pa

    return pa


@dataclass(frozen=True)
class MetaSpec:
    """Which fields of each sample's json become parquet columns, and which the stats tally."""

    columns: Tuple[Tuple[str, str], ...] = ()
    """(json field, Arrow type name: string, int64, float64, bool, or json) in column order; a
    missing field is null. `json`: a string column of the value as the json holds it (a string
    as itself, any other value as its JSON text), for pass-through fields of any type. `key`,
    `shard`, `members` and `bytes` are always there and are not listed."""
    tally: Tuple[str, ...] = ()
    """Columns whose values the stats count (`"values": {"mode": {"replay": 90, "eager": 10}}`)."""

    def schema(self):
        pa = _pa()
        types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
                 "json": pa.string()}
        fields = [pa.field("key", pa.string()), pa.field("shard", pa.string())]
        fields += [pa.field(name, types[kind]) for name, kind in self.columns]
        fields += [pa.field("members", pa.list_(pa.string())), pa.field("bytes", pa.int64())]
        return pa.schema(fields)

    def __post_init__(self) -> None:
        names = [n for n, _ in self.columns]
        assert not {"key", "shard", "members", "bytes"} & set(names) and len(set(names)) == len(names), names
        assert set(self.tally) <= set(names), (self.tally, names)


@dataclass
class Row:
    """One sample as the parquet sees it."""

    key: str
    meta: dict
    members: List[str]
    nbytes: int
    """Payload bytes of the sample's members (image + json + txt)."""


@dataclass
class ShardLog:
    """What a shard's stats need, gathered while it is open."""

    start: float = field(default_factory=time.time)
    rows: List[Row] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    """reason -> items of this shard's stretch that were not written (e.g. sent to a ledger)."""


def sidecar_names(url: str) -> Tuple[str, str]:
    """(parquet, stats) names of shard `url` (`X.tar` -> `X.parquet`, `X_stats.json`)."""
    assert url.endswith(".tar"), url
    stem = url[: -len(".tar")]
    return stem + PARQUET_SUFFIX, stem + STATS_SUFFIX


def sidecar_globs(tar_glob: str) -> Tuple[str, str]:
    """The sidecar globs of a shard glob (`shard-u0000003-*.tar` -> `shard-u0000003-*.parquet`, ...)."""
    return sidecar_names(tar_glob)


def _cell(value, kind: str):
    if kind != "json" or value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def parquet_bytes(url: str, rows: List[Row], spec: MetaSpec) -> bytes:
    pa = _pa()
    import pyarrow.parquet as pq

    schema = spec.schema()
    data: Dict[str, list] = {"key": [r.key for r in rows], "shard": [url] * len(rows)}
    for name, kind in spec.columns:
        data[name] = [_cell(r.meta.get(name), kind) for r in rows]
    data["members"] = [r.members for r in rows]
    data["bytes"] = [r.nbytes for r in rows]
    table = pa.Table.from_pydict(data, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def stats_doc(url: str, log: ShardLog, filesize: Optional[int], spec: MetaSpec, end: Optional[float],
              rebuilt: bool = False) -> dict:
    """img2dataset's `_stats.json` fields (count, successes, status_dict, start/end time, duration) for one shard."""
    successes = len(log.rows)
    failures = sum(log.failures.values())
    values: Dict[str, Dict[str, int]] = {}
    for name in spec.tally:
        values[name] = dict(sorted(Counter(json.dumps(r.meta.get(name)).strip('"') for r in log.rows).items()))
    doc = {
        "shard": url, "count": successes + failures, "successes": successes, "failures": failures,
        "status_dict": dict(sorted({"success": successes, **log.failures}.items())) if successes or failures else {},
        "bytes": filesize, "start_time": None if rebuilt else log.start, "end_time": end,
        "duration": None if rebuilt or end is None else round(end - log.start, 6), "values": values,
    }
    if rebuilt:
        doc["rebuilt"] = True  # from the tar after a crash: failures and times were not kept
    return doc


def _entry(path: Path, data: bytes) -> Sidecar:
    return [path.name, len(data), hashlib.sha256(data).hexdigest()]


@dataclass
class Staged:
    """Sidecars written to temp names, ready to be renamed once their shard is committed."""

    pairs: List[Tuple[Path, Path, Sidecar]]  # (temp, final, entry)

    def publish(self) -> List[Sidecar]:
        from sinks.atomic import fsync_dir

        for tmp, final, _ in self.pairs:
            os.replace(tmp, final)
        if self.pairs:
            fsync_dir(self.pairs[0][1].parent)
        return [entry for _, _, entry in self.pairs]

    def stamps(self) -> Dict[str, str]:
        """{final name: stamp} of the staged files (a rename keeps the mtime)."""
        from sinks.tar_check import file_stamp

        return {final.name: file_stamp(os.stat(tmp)) for tmp, final, _ in self.pairs}

    def discard(self) -> None:
        for tmp, _, _ in self.pairs:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # the resume scan removes it


def stage(output_dir: Path, url: str, log: ShardLog, filesize: int, spec: MetaSpec,
          rebuilt: bool = False, temp_tag: str = "") -> Staged:
    """Write both sidecars of shard `url` under temp names, fsync'd (nothing is visible yet)."""
    from sinks.atomic import temp_path_for, write_synced

    staged = Staged([])
    parquet, stats = sidecar_names(url)
    docs = [(parquet, parquet_bytes(url, log.rows, spec)),
            (stats, (json.dumps(stats_doc(url, log, filesize, spec, None if rebuilt else time.time(), rebuilt),
                                indent=1) + "\n").encode())]
    try:
        for name, data in docs:
            final = Path(output_dir) / name
            tmp = temp_path_for(final, temp_tag)
            write_synced(tmp, data)
            staged.pairs.append((tmp, final, _entry(final, data)))
    except BaseException:
        staged.discard()
        raise
    return staged


def rows_from_tar(path: Path) -> List[Row]:
    """The parquet rows of a committed shard, read back from its members (for a rebuild)."""
    rows: Dict[str, Row] = {}
    order: List[str] = []
    with tarfile.open(path, mode="r:") as tar:
        for member in tar:
            stem = member.name.split(".", 1)[0]
            if stem not in rows:
                rows[stem] = Row(key="", meta={}, members=[], nbytes=0)
                order.append(stem)
            row = rows[stem]
            row.members.append(member.name)
            row.nbytes += member.size
            if member.name == f"{stem}.json":
                f = tar.extractfile(member)
                # A shard's json members are regular files (TarShard writes no other kind).
                assert f is not None, member.name
                row.meta = json.loads(f.read())
                row.key = row.meta["key"]
    return [rows[s] for s in order]


def rebuild(output_dir: Path, url: str, filesize: int, spec: MetaSpec) -> List[Sidecar]:
    """Write the sidecars of a committed shard from its tar (a crash lost them, or they were damaged)."""
    log = ShardLog(rows=rows_from_tar(Path(output_dir) / url))
    return stage(output_dir, url, log, filesize, spec, rebuilt=True).publish()


def check_sidecars(output_dir: Path, listed: List[Sidecar], level: str, stamps: Optional[dict] = None) -> List[str]:
    """What differs between the sidecars a manifest lists and the files ([] when they match). A file
    whose stamp moved since its commit (`stamps`) is hashed at any level."""
    from sinks.tar_check import file_stamp

    problems = []
    for name, size, sha256 in listed:
        path = Path(output_dir) / name
        try:
            st = path.stat()
        except OSError as err:
            problems.append(f"{name}: {err.strerror}")
            continue
        found = st.st_size
        moved = (stamps or {}).get(name) not in (None, file_stamp(st))
        if found != size:
            problems.append(f"{name}: {found} bytes, manifest says {size}")
        elif (level == "full" or moved) and hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
            problems.append(f"{name}: sha256 differs from the manifest's")
    return problems


def adopt(output_dir: Path, url: str, keys: List[str]) -> Optional[List[Sidecar]]:
    """Entries for sidecars found beside a shard that has no manifest (a crash between their
    rename and the manifest write), if the parquet reads back with the shard's keys; else None."""
    import pyarrow.parquet as pq

    parquet, stats = (Path(output_dir) / n for n in sidecar_names(url))
    try:
        if pq.read_table(parquet, columns=["key"]).column("key").to_pylist() != list(keys):
            return None
        json.loads(stats.read_bytes())
        return [_entry(p, p.read_bytes()) for p in (parquet, stats)]
    except (OSError, ValueError, KeyError, _pa().ArrowException):
        return None
