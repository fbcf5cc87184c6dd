"""Webdataset sink: samples -> atomically committed tar shards, their parquet and stats, manifests
and a wids index; optionally mirrored to an object store (remote.py).

Knows nothing of diffusion: a sample is a key, an RGB uint8 image, a caption and a JSON dict.
"""

from sinks.async_sink import AsyncSink
from sinks.config import IMAGE_FORMATS, SinkConfig
from sinks.encode import encode_image
from sinks.errors import CorruptShardError, SinkError
from sinks.index import INDEX_NAME, wids_index, write_wids_index
from sinks.keys import MAX_STEM_LEN, key_from_stem, member_stem
from sinks.manifest import ScanResult, ShardRecord, read_record, record_from_tar, scan_output
from sinks.sample import EncodedSample, Sample
from sinks.shard_writer import DEFAULT_NAME_PATTERN, ShardWriter
from sinks.sidecars import MetaSpec

__all__ = [
    "AsyncSink",
    "CorruptShardError",
    "DEFAULT_NAME_PATTERN",
    "EncodedSample",
    "IMAGE_FORMATS",
    "INDEX_NAME",
    "MAX_STEM_LEN",
    "MetaSpec",
    "Sample",
    "ScanResult",
    "ShardRecord",
    "ShardWriter",
    "SinkConfig",
    "SinkError",
    "encode_image",
    "key_from_stem",
    "member_stem",
    "read_record",
    "record_from_tar",
    "scan_output",
    "wids_index",
    "write_wids_index",
]
