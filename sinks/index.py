"""The wids shard index (`wids-shard-index-v1`): one JSON file listing every shard of a dataset.

wids resolves each `url` relative to the index file's directory, so urls are shard file names
relative to output_dir, and `wids.ShardListDataset("OUTPUT_DIR/index.wids.json")` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from sinks.atomic import atomic_write_bytes
from sinks.manifest import ShardRecord
from sinks.names import INDEX_NAME


def wids_index(records: Iterable[ShardRecord], name: str | None = None) -> dict:
    """The index document; shards sorted by url so every rank/merge order gives the same file."""
    records = sorted(records, key=lambda r: r.url)
    urls = [r.url for r in records]
    if len(set(urls)) != len(urls):
        dupes = sorted({u for u in urls if urls.count(u) > 1})
        raise ValueError(f"shard records list {dupes} more than once; pass each committed shard once.")
    doc: dict = {"__kind__": "wids-shard-index-v1", "wids_version": 1}
    if name is not None:
        doc["name"] = name
    doc["shardlist"] = [
        {"url": r.url, "nsamples": r.nsamples, "filesize": r.filesize, "sha256": r.sha256} for r in records
    ]
    return doc


def write_wids_index(
    output_dir: str | Path, records: Iterable[ShardRecord], name: str = INDEX_NAME, dataset_name: str | None = None
) -> Path:
    """Write `output_dir/name` atomically (a reader sees the old index or the new one); returns its path."""
    path = Path(output_dir) / name
    text = json.dumps(wids_index(records, dataset_name), indent=1)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
