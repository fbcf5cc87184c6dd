"""`Sample` (what callers hand the sink) and `EncodedSample` (the tar members it becomes).

Everything that can fail on bad input (key, image shape, meta that is not JSON) is checked in
`prepare_sample`, on the caller's thread, so the caller gets a ValueError at `put` instead of a
dead writer thread later. Only the image encoding itself is left for the encode threads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sinks.encode import check_image, encode_image
from sinks.keys import member_stem


@dataclass
class Sample:
    """One generated item: its key, pixels, caption and JSON-serializable metadata."""

    key: str
    image: np.ndarray  # [H, W, 3] uint8 RGB
    caption: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedSample:
    """A sample as tar members: `STEM.<image_ext>`, `STEM.json`, `STEM.txt`, in that order."""

    key: str
    stem: str
    image_ext: str
    image: bytes
    meta_json: bytes
    caption: bytes

    def members(self) -> list[tuple[str, bytes]]:
        return [
            (f"{self.stem}.{self.image_ext}", self.image),
            (f"{self.stem}.json", self.meta_json),
            (f"{self.stem}.txt", self.caption),
        ]


@dataclass(frozen=True)
class PreparedSample:
    """A checked sample whose image still needs encoding."""

    key: str
    stem: str
    image: np.ndarray
    meta_json: bytes
    caption: bytes

    def encoded(self, image_ext: str, image_bytes: bytes) -> EncodedSample:
        return EncodedSample(self.key, self.stem, image_ext, image_bytes, self.meta_json, self.caption)


def meta_json_bytes(key: str, meta: dict[str, Any]) -> bytes:
    """The sample's json: `meta` plus the original key, sorted keys so equal input gives equal bytes."""
    if not isinstance(meta, dict):
        raise ValueError(f"sample {key!r}: meta must be a dict, got {type(meta).__name__}.")
    if "key" in meta and meta["key"] != key:
        raise ValueError(f"sample {key!r}: meta['key']={meta['key']!r} differs from the sample key; drop it or make them equal.")
    try:
        # allow_nan=False: NaN is not JSON and breaks strict readers; record it as a string or flag.
        text = json.dumps({**meta, "key": key}, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"sample {key!r}: meta is not JSON-serializable ({err}); pass str/int/float/bool/list/dict values.") from None
    return text.encode("utf-8")


def prepare_sample(sample: Sample) -> PreparedSample:
    if not isinstance(sample, Sample):
        raise ValueError(f"expected a sinks.Sample, got {type(sample).__name__}.")
    stem = member_stem(sample.key)
    image = check_image(sample.image, f"sample {sample.key!r}")
    if not isinstance(sample.caption, str):
        raise ValueError(f"sample {sample.key!r}: caption must be a str, got {type(sample.caption).__name__}.")
    caption = sample.caption.encode("utf-8", errors="surrogatepass")
    return PreparedSample(sample.key, stem, image, meta_json_bytes(sample.key, sample.meta), caption)


def encode_sample(sample: Sample, fmt: str, quality: int) -> EncodedSample:
    """Prepare and encode on the calling thread (the synchronous path)."""
    prepared = prepare_sample(sample)
    return prepared.encoded(fmt, encode_image(prepared.image, fmt, quality))
