"""`SinkConfig`: the `sink` config node (registered with Hydra by the job, validated here)."""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_FORMATS = ("jpg", "png", "webp")


def _require(ok: bool, key: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"sink.{key}={value!r} is invalid: expected {expected}. Set sink.{key} to a valid value.")


@dataclass
class SinkConfig:
    """How images are encoded and how samples are cut into webdataset tar shards.

    Field types stay OmegaConf-compatible (no Literal): Hydra builds this node from the class.
    Validation runs in `__post_init__`, i.e. when the job turns the node into this object
    (`OmegaConf.to_object`), before any model loads.
    """

    format: str = "jpg"
    """Image encoding and tar member extension: one of jpg, png (lossless), webp."""

    quality: int = 95
    """Encoder quality 1..100 for jpg and webp; ignored by png (always lossless)."""

    maxcount: int = 1000
    """Samples per shard at most; a shard is committed and the next started when it is reached."""

    maxsize: int = 1_000_000_000
    """Bytes per shard file at most (tar padding included), unless a single sample is larger."""

    encode_threads: int = 2
    """Threads encoding images in parallel (PIL releases the GIL while encoding)."""

    queue_size: int = 64
    """Samples waiting to be encoded/written at most; a full queue blocks `put` (backpressure)."""

    def __post_init__(self) -> None:
        _require(self.format in IMAGE_FORMATS, "format", self.format, f"one of {', '.join(IMAGE_FORMATS)}")
        _require(_is_int(self.quality) and 1 <= self.quality <= 100, "quality", self.quality, "an integer in 1..100")
        _require(_is_int(self.maxcount) and self.maxcount > 0, "maxcount", self.maxcount, "an integer > 0")
        _require(_is_int(self.maxsize) and self.maxsize > 0, "maxsize", self.maxsize, "an integer number of bytes > 0")
        _require(
            _is_int(self.encode_threads) and self.encode_threads >= 1, "encode_threads", self.encode_threads, "an integer >= 1"
        )
        _require(_is_int(self.queue_size) and self.queue_size >= 1, "queue_size", self.queue_size, "an integer >= 1")


def _is_int(value: object) -> bool:
    # bool is an int subclass; `maxcount=true` in YAML is a typo, not 1.
    return isinstance(value, int) and not isinstance(value, bool)
