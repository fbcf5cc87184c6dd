"""What a person wants to know about a written video or soundtrack, read from its bytes (not its json).

    video_info(mp4 bytes) -> frames, width, height, fps, and the first frame (a thumbnail)
    wav_seconds(wav bytes) -> duration

For `python -m jobs.inspect`: the file is the truth the json only claims. PyAV (the `video` extra)
reads the mp4, the standard library's `wave` the wav.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VideoInfo:
    frames: int
    width: int
    height: int
    fps: float
    first: np.ndarray  # uint8 [H, W, 3] RGB: the first frame

    def describe(self) -> str:
        return f"{self.frames} frames, {self.width}x{self.height}, {self.fps:g} fps"


def video_info(data: bytes) -> VideoInfo:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        first = None
        frames = 0
        # Counted by decoding, not from the container's nb_frames (absent in some muxers' files):
        # every frame must be decoded anyway to know the count is real.
        for frame in container.decode(stream):
            if first is None:
                first = frame.to_ndarray(format="rgb24")
            frames += 1
        fps = float(stream.average_rate) if stream.average_rate else 0.0
        if first is None:
            raise ValueError("the mp4 holds no decodable frame")
        return VideoInfo(frames=frames, width=int(first.shape[1]), height=int(first.shape[0]), fps=round(fps, 3),
                         first=first)


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data), "rb") as w:
        return w.getnframes() / w.getframerate()
