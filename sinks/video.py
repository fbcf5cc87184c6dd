"""The `video` kind: `Video` frames -> `KEY.mp4`, H.264 (libx264) in MP4 through PyAV.

PyAV's wheels bundle FFmpeg with libx264 (`pip install 'bcgen[video]'`, or `pip install av`).

Deterministic settings, so equal frames give equal bytes: one encoder thread (x264's output
depends on its thread count, which would otherwise follow the machine's cores), CRF rate control
(no bitrate feedback from timing), constant frame rate with pts = frame index, and the muxer's
`bitexact` flag (no FFmpeg version string in the file). x264's own SEI still names its version
and settings, so the bytes are reproducible for one PyAV build, and not across PyAV/FFmpeg/x264
versions. Not on every CPU either: the CPU machines tested repeat themselves (tests/test_sinks_video.py),
but on the H200 host the same frames sometimes give other bytes in another process (session 21:
one packet of nine differs between the graph job, the eager job and a re-encode, each in its own
process, while three encodes in one process agreed; a re-run gave equal bytes; seeded clips, with
swscale or numpy doing the RGB -> YUV step, repeated themselves in four processes:
benchmarks/probe_mp4_repeat.py). The cause there is not found yet. Where bytes must repeat across runs and machines,
the per-frame images (`sink.video_frames`) are the record. Resume and verify never re-encode:
they compare shards with the manifests written when they were committed.

Colour: the frames are RGB; H.264 stores 4:2:0 YUV (yuv420p, what every player decodes), so
width and height must be even, and the round trip is lossy (crf 18: a few levels per channel on
smooth content). Per-frame images (`sink.video_frames`) are the lossless or exact-size option.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from sinks.kinds import Encoder, register_encoder

if TYPE_CHECKING:
    from sinks.config import SinkConfig

CODEC = "libx264"
MAX_FPS = 1000.0


@dataclass(frozen=True)
class Video:
    """Frames of one clip and the rate they play at."""

    frames: np.ndarray  # [F, H, W, 3] uint8 RGB
    fps: float


def fps_fraction(fps: float) -> Fraction:
    """The stream's frame rate: exact for integers, NTSC rates kept (23.976 -> 24000/1001)."""
    return Fraction(fps).limit_denominator(1001)


def check_video(video: object, ext: str, where: str) -> Video:
    if not isinstance(video, Video):
        raise ValueError(f"{where}: a .{ext} member must be a sinks.Video(frames, fps), got {type(video).__name__}.")
    frames = video.frames
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 \
            or 0 in frames.shape:
        shape = getattr(frames, "shape", None)
        raise ValueError(f"{where}: video frames have type {type(frames).__name__}, "
                         f"dtype {getattr(frames, 'dtype', None)} and shape {shape}; "
                         f"expected a uint8 numpy array [F, H, W, 3] (RGB) with F, H, W > 0.")
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ValueError(f"{where}: video frames are {frames.shape[1]}x{frames.shape[2]}; H.264 in yuv420p needs an "
                         f"even height and width (crop or pad by one pixel).")
    fps = video.fps
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not (math.isfinite(fps) and 0 < fps <= MAX_FPS):
        raise ValueError(f"{where}: video fps={fps!r}; expected a number in (0, {MAX_FPS:g}], e.g. 16 or 24.")
    return Video(np.ascontiguousarray(frames), float(fps))


def encode_mp4(video: Video, ext: str, config: "SinkConfig") -> bytes:
    import av

    frames = video.frames
    out = io.BytesIO()
    # No +faststart: it rewrites the file in a second pass, which needs a named file.
    with av.open(out, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(CODEC, rate=fps_fraction(video.fps))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(config.video_crf), "preset": config.video_preset, "threads": "1"}
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():  # flush the encoder's delayed frames
            container.mux(packet)
    return out.getvalue()


def check_encoder_available() -> str | None:
    """None when PyAV and its libx264 encoder are importable here, else what is missing and how to fix it."""
    try:
        import av
    except ImportError as err:
        return f"PyAV is not installed ({err}); install it with `pip install 'bcgen[video]'` (or `pip install av`)"
    if CODEC not in av.codecs_available:
        return (f"this PyAV build (av {av.__version__}) has no {CODEC} encoder; install PyAV's own wheel "
                f"(`pip install --force-reinstall av`), which bundles FFmpeg with {CODEC}")
    return None


register_encoder(Encoder("video", ("mp4",), check_video, encode_mp4))
