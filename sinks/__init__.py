"""Webdataset sink: samples -> atomically committed tar shards, their parquet and stats, manifests
and a wids index; optionally mirrored to an object store (remote.py).

Knows nothing of diffusion: a sample is a key and its members by extension (an RGB uint8 image,
a `Video`, an `Audio`, ...), a caption and a JSON dict; encoders by kind live in sinks/kinds.py.
"""

from sinks.async_sink import AsyncSink
from sinks.audio import Audio
from sinks.config import IMAGE_FORMATS, SinkConfig
from sinks.encode import encode_image
from sinks.errors import CorruptShardError, SinkError
from sinks.index import wids_index, write_wids_index
from sinks.keys import MAX_STEM_LEN, key_from_stem, member_stem
from sinks.kinds import KINDS, Encoder, encoder_for, known_extensions, register_encoder
from sinks.manifest import ScanResult, ShardRecord, read_record, record_from_tar, scan_output
from sinks.names import INDEX_NAME
from sinks.sample import EncodedSample, Sample
from sinks.shard_writer import DEFAULT_NAME_PATTERN, ShardWriter
from sinks.sidecars import MetaSpec
from sinks.video import Video

__all__ = [
    "Audio",
    "AsyncSink",
    "CorruptShardError",
    "DEFAULT_NAME_PATTERN",
    "EncodedSample",
    "Encoder",
    "IMAGE_FORMATS",
    "INDEX_NAME",
    "KINDS",
    "MAX_STEM_LEN",
    "MetaSpec",
    "Sample",
    "ScanResult",
    "ShardRecord",
    "ShardWriter",
    "SinkConfig",
    "SinkError",
    "Video",
    "encode_image",
    "encoder_for",
    "key_from_stem",
    "known_extensions",
    "member_stem",
    "read_record",
    "record_from_tar",
    "register_encoder",
    "scan_output",
    "wids_index",
    "write_wids_index",
]
