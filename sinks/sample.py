"""`Sample` (what callers hand the sink) and `EncodedSample` (the tar members it becomes).

A sample is a key and a mapping of extension -> payload, as in webdataset. Three members have
names of their own because every sample has them or the job's images do: `image` (written as
`KEY.<sink.format>`), `meta` (`KEY.json`, with the key added) and `caption` (`KEY.txt`). Any
other member goes in `media`: `{"mp4": Video(...), "wav": Audio(...), "f0000.webp": frame}`.
Members are written in the order image, media (as given), json, txt; an image sample's bytes are
what they were before media existed.

Everything that can fail on bad input (key, payload shapes, meta that is not JSON) is checked in
`prepare_sample`, on the caller's thread, so the caller gets a ValueError at `put` instead of a
dead writer thread later. Only the encoding itself is left for the encode threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sinks.config import SinkConfig
from sinks.keys import MAX_STEM_LEN, USTAR_NAME_BYTES, member_stem
from sinks.kinds import check_payload, encode_payload
from sinks.text import json_bytes, text_bytes

RESERVED = ("json", "txt")  # meta and caption: one of each per sample
MAX_EXT_LEN = 40  # leaves a stem of 59 characters in the 100-byte USTAR name


@dataclass
class Sample:
    """One generated item: its key, its payloads by member extension, a caption and JSON metadata."""

    key: str
    image: Optional[np.ndarray] = None  # [H, W, 3] uint8 RGB, written as KEY.<sink.format>
    caption: str = ""
    meta: Dict[str, Any] = field(default_factory=dict)
    media: Dict[str, Any] = field(default_factory=dict)
    """More members, extension -> payload (sinks/kinds.py): a Video, an Audio, an image array, bytes."""


@dataclass(frozen=True)
class EncodedSample:
    """A sample as tar members `STEM.<ext>`, in write order."""

    key: str
    stem: str
    payloads: Tuple[Tuple[str, bytes], ...]  # (ext, bytes)

    def members(self) -> List[Tuple[str, bytes]]:
        return [(f"{self.stem}.{ext}", data) for ext, data in self.payloads]

    @property
    def meta_json(self) -> bytes:
        """The `KEY.json` payload (the shard's parquet row is made from it, sinks/sidecars.py)."""
        return next(data for ext, data in self.payloads if ext == "json")


@dataclass(frozen=True)
class PreparedSample:
    """A checked sample; payloads that are not bytes yet are encoded by `encoded`."""

    key: str
    stem: str
    payloads: Tuple[Tuple[str, Any], ...]

    def encoded(self, config: SinkConfig) -> EncodedSample:
        return EncodedSample(self.key, self.stem,
                             tuple((ext, encode_payload(p, ext, config)) for ext, p in self.payloads))


def meta_json_bytes(key: str, meta: dict[str, Any]) -> bytes:
    """The sample's json: `meta` plus the original key, sorted keys so equal input gives equal bytes."""
    if not isinstance(meta, dict):
        raise ValueError(f"sample {key!r}: meta must be a dict, got {type(meta).__name__}.")
    if "key" in meta and meta["key"] != key:
        raise ValueError(f"sample {key!r}: meta['key']={meta['key']!r} differs from the sample key; "
                         f"drop it or make them equal.")
    return json_bytes({**meta, "key": key}, f"sample {key!r}")


def _media_exts(sample: Sample, image_format: str) -> List[str]:
    if not isinstance(sample.media, dict):
        raise ValueError(f"sample {sample.key!r}: media must be a dict of extension -> payload, "
                         f"got {type(sample.media).__name__}.")
    taken = set(RESERVED) | ({image_format} if sample.image is not None else set())
    for ext in sample.media:
        if (not isinstance(ext, str) or not ext or len(ext) > MAX_EXT_LEN or ext.startswith(".") or "/" in ext
                or ext != ext.strip()):
            raise ValueError(f"sample {sample.key!r}: media extension {ext!r} is invalid; use e.g. 'mp4' or "
                             f"'f0000.webp' (no leading dot, no '/', at most {MAX_EXT_LEN} characters).")
        if ext in taken:
            raise ValueError(f"sample {sample.key!r}: media holds {ext!r}, which the sample's "
                             f"{'meta' if ext == 'json' else 'caption' if ext == 'txt' else 'image'} already writes.")
    return list(sample.media)


def prepare_sample(sample: Sample, image_format: str) -> PreparedSample:
    if not isinstance(sample, Sample):
        raise ValueError(f"expected a sinks.Sample, got {type(sample).__name__}.")
    if not isinstance(sample.key, str) or not sample.key:
        member_stem(sample.key)  # raises its message
    where = f"sample {sample.key!r}"
    exts = _media_exts(sample, image_format)
    # Every member name must fit the 100-byte USTAR name field (sinks/keys.py): long extensions
    # (a video's per-frame members) leave the stem less room.
    longest = max([len(e) for e in exts] + [len(image_format), len("json")])
    stem = member_stem(sample.key, max_len=min(MAX_STEM_LEN, USTAR_NAME_BYTES - 1 - longest))
    payloads: List[Tuple[str, Any]] = []
    if sample.image is not None:
        payloads.append((image_format, check_payload(sample.image, image_format, where)))
    payloads += [(ext, check_payload(sample.media[ext], ext, f"{where} .{ext}")) for ext in exts]
    payloads.append(("json", meta_json_bytes(sample.key, sample.meta)))
    payloads.append(("txt", text_bytes(sample.caption, where)))
    return PreparedSample(sample.key, stem, tuple(payloads))


def encode_sample(sample: Sample, config: SinkConfig | str, quality: int = 95) -> EncodedSample:
    """Prepare and encode on the calling thread (the synchronous path). `config` may be an image
    format name, with `quality`, for image-only samples."""
    if isinstance(config, str):
        config = SinkConfig(format=config, quality=quality)
    return prepare_sample(sample, config.format).encoded(config)
