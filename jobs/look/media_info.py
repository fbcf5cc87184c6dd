"""What a person wants to know about a written video or soundtrack, read from its bytes (not its json).

    video_info(mp4 bytes) -> frames, width, height, fps, and the first frame (a thumbnail): every frame decoded
    wav_seconds(wav bytes) -> duration

For `python -m jobs.inspect`: the file is the truth the json only claims. PyAV (the `video` extra)
reads the mp4, the standard library's `wave` the wav. Where PyAV does not import, no
mp4 can be read here, which says nothing of the files: PyAVCheck says so once, with the install
command, and the pages say "not read", never that a clip is broken.
"""

from __future__ import annotations

import io
import logging
import wave
from dataclasses import dataclass
from typing import Optional

import numpy as np

log = logging.getLogger("jobs.inspect")

PYAV_INSTALL = "pip install -e '.[video]' (the video extra; or pip install 'av>=14')"


class PyAVMissing(RuntimeError):
    """PyAV does not import here: no mp4 can be read (the message says why and how to install it)."""


def import_av():
    try:
        import av
    except ImportError as err:  # not installed, or installed without its FFmpeg libraries
        raise PyAVMissing(f"PyAV cannot be imported here ({err}), so no mp4 is read; install it: {PYAV_INSTALL}") \
            from None
    return av


class PyAVCheck:
    """Whether PyAV imports, asked at the first mp4 (an output of images never needs it) and, where it does
    not, logged once: not a warning a clip, each blaming the file."""

    def __init__(self, shown: str):
        self.shown = shown  # what the look still shows of a clip without PyAV
        self._missing: Optional[PyAVMissing] = None
        self._asked = False

    def missing(self) -> Optional[str]:
        """None where PyAV imports; else the words a clip's caption gets."""
        if not self._asked:
            self._asked = True
            try:
                import_av()
            except PyAVMissing as e:
                self._missing = e
                log.warning("%s; %s", e, self.shown)
        if self._missing is None:
            return None
        return f"frames, size and fps not read: PyAV does not import here ({PYAV_INSTALL})"


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
    av = import_av()
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
