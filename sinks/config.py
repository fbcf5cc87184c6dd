"""`SinkConfig`: the `sink` config node (registered with Hydra by the job, validated here)."""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_FORMATS = ("jpg", "png", "webp")
VIDEO_FRAMES = ("none", *IMAGE_FORMATS)
# libx264's presets, fastest first: slower ones make smaller files of the same quality.
VIDEO_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")


def _require(ok: bool, key: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"sink.{key}={value!r} is invalid: expected {expected}. Set sink.{key} to a valid value.")


@dataclass
class SinkConfig:
    """How images and videos are encoded and how samples are cut into webdataset tar shards.

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

    video_crf: int = 18
    """H.264 constant rate factor of `KEY.mp4` (libx264): 0 = lossless, 18 = visually lossless,
    23 = libx264's default; each +6 roughly halves the file."""

    video_preset: str = "medium"
    """libx264 preset: ultrafast .. veryslow (slower: smaller file, same quality)."""

    video_frames: str = "none"
    """Also write every frame of a video as its own image, `KEY.fNNNN.<fmt>`: none | jpg | png | webp."""

    def __post_init__(self) -> None:
        _require(self.format in IMAGE_FORMATS, "format", self.format, f"one of {', '.join(IMAGE_FORMATS)}")
        _require(_is_int(self.quality) and 1 <= self.quality <= 100, "quality", self.quality, "an integer in 1..100")
        _require(_is_int(self.maxcount) and 0 < self.maxcount <= 10_000_000, "maxcount", self.maxcount,
                 "an integer in 1..10000000")
        _require(_is_int(self.maxsize) and 0 < self.maxsize <= 1 << 40, "maxsize", self.maxsize,
                 "an integer number of bytes in 1..2**40")
        _require(
            _is_int(self.encode_threads) and 1 <= self.encode_threads <= 256, "encode_threads", self.encode_threads,
            "an integer in 1..256"
        )
        _require(_is_int(self.queue_size) and 1 <= self.queue_size <= 100_000, "queue_size", self.queue_size,
                 "an integer in 1..100000")
        _require(_is_int(self.video_crf) and 0 <= self.video_crf <= 51, "video_crf", self.video_crf,
                 "an integer in 0..51 (18: visually lossless)")
        _require(self.video_preset in VIDEO_PRESETS, "video_preset", self.video_preset,
                 f"one of {', '.join(VIDEO_PRESETS)}")
        _require(self.video_frames in VIDEO_FRAMES, "video_frames", self.video_frames,
                 f"one of {', '.join(VIDEO_FRAMES)}")


def _is_int(value: object) -> bool:
    # bool is an int subclass; `maxcount=true` in YAML is a typo, not 1.
    return isinstance(value, int) and not isinstance(value, bool)
