"""The `audio` kind: `Audio` samples -> `KEY.wav` (16-bit PCM), with the standard library's `wave`.

For families that generate sound beside their video (LTX-2's audio branch). Float samples in
[-1, 1] are clipped and scaled to int16 by one rule (round half to even, as numpy rounds), int16
samples are written as they are: equal input gives equal bytes, on any machine.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sinks.kinds import Encoder, register_encoder

if TYPE_CHECKING:
    from sinks.config import SinkConfig

MAX_CHANNELS = 16


@dataclass(frozen=True)
class Audio:
    """One clip's sound."""

    samples: np.ndarray  # [N] or [N, C]: float in [-1, 1], or int16
    sample_rate: int


def check_audio(audio: object, ext: str, where: str) -> Audio:
    if not isinstance(audio, Audio):
        raise ValueError(f"{where}: a .{ext} member must be a sinks.Audio(samples, sample_rate), got "
                         f"{type(audio).__name__}.")
    x = audio.samples
    ok = isinstance(x, np.ndarray) and x.ndim in (1, 2) and x.shape[0] > 0 and (
        x.dtype == np.int16 or np.issubdtype(x.dtype, np.floating))
    if not ok or (x.ndim == 2 and not 1 <= x.shape[1] <= MAX_CHANNELS):
        raise ValueError(f"{where}: audio samples have type {type(x).__name__}, dtype {getattr(x, 'dtype', None)} and "
                         f"shape {getattr(x, 'shape', None)}; expected [N] or [N, C] (C <= {MAX_CHANNELS}), float in "
                         f"[-1, 1] or int16.")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise ValueError(f"{where}: audio samples hold NaN or Inf.")
    rate = audio.sample_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or not 0 < rate <= 1_000_000:
        raise ValueError(f"{where}: audio sample_rate={rate!r}; expected an integer number of Hz, e.g. 24000.")
    return Audio(x if x.ndim == 2 else x[:, None], int(rate))


def to_int16(samples: np.ndarray) -> np.ndarray:
    if samples.dtype == np.int16:
        return samples
    return np.round(np.clip(samples.astype(np.float64), -1.0, 1.0) * 32767.0).astype(np.int16)


def encode_wav(audio: Audio, ext: str, config: "SinkConfig") -> bytes:
    pcm = np.ascontiguousarray(to_int16(audio.samples)).astype("<i2", copy=False)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(audio.sample_rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


register_encoder(Encoder("audio", ("wav",), check_audio, encode_wav))
