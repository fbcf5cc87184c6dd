"""What a person wants to know about a written image, video or soundtrack, read from its bytes (not its json).

    video_info(mp4 bytes) -> frames, width, height, fps, and the first frame (a thumbnail): every frame decoded
    video_header(mp4 bytes) -> frames, width, height, fps from the container alone (pages: every sample)
    image_size(image bytes) -> "WxH", from its header
    wav_seconds(wav bytes) -> duration; sound_info(wav bytes) -> "sound 0.38 s"

For `python -m jobs.inspect`: the file is the truth the json only claims. PyAV (the `video` extra)
reads the mp4, PIL the image, the standard library's `wave` the wav. Where PyAV does not import, no
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
    not, logged once (one check for the gallery and the pages): not a warning a clip, each blaming the file."""

    def __init__(self) -> None:
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
                log.warning("%s; the pages play the clips, but the sheet shows no frame of them and no caption "
                            "says their frames, size and fps", e)
        if self._missing is None:
            return None
        return f"frames, size and fps not read: PyAV does not import here ({PYAV_INSTALL})"


@dataclass(frozen=True)
class VideoHeader:
    frames: int  # 0: the container does not say (only video_info counts them)
    width: int
    height: int
    fps: float

    def describe(self) -> str:
        frames = f"{self.frames} frames" if self.frames else "frames not counted"
        return f"{frames}, {self.width}x{self.height}, {self.fps:g} fps"


@dataclass(frozen=True)
class VideoInfo(VideoHeader):
    first: np.ndarray  # uint8 [H, W, 3] RGB: the first frame


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


def video_header(data: bytes) -> VideoHeader:
    """What the container says, nothing decoded: milliseconds a clip, where video_info decodes every frame."""
    av = import_av()
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else 0.0
        return VideoHeader(frames=int(stream.frames), width=int(stream.codec_context.width),
                           height=int(stream.codec_context.height), fps=round(fps, 3))


def image_size(data: bytes) -> str:
    """`WxH` from the image's header (PIL reads no pixels for it)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return f"{image.size[0]}x{image.size[1]}"


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data), "rb") as w:
        return w.getnframes() / w.getframerate()


def sound_info(data: bytes) -> str:
    """What a caption says of a soundtrack: its length, or that it does not open (said, not a crash)."""
    try:
        return f"sound {wav_seconds(data):.2f} s"
    except (wave.Error, EOFError, ZeroDivisionError) as e:
        return f"wav does not open: {e}"
