"""Encoders by kind, and the extension table that picks one (webdataset's writer works the same way).

A sample is a mapping of member extension -> payload (sinks/sample.py). The last dotted part of
the extension picks the encoder, as webdataset's decoders pick by it on the way back:
`mp4` -> video, `png` -> image, `f0003.webp` (a video's frame 3) -> image as webp.

Kinds: image (jpg, png, webp), video (mp4), audio (wav), json, txt. Each encoder has two halves:

- `check(payload, ext, where)`: runs on the caller's thread when a sample is put, and raises
  ValueError naming what is wrong, so a bad payload never reaches (and kills) a sink thread. It
  returns what `encode` takes, or the final bytes for the cheap kinds (json, txt).
- `encode(payload, ext, config)`: runs on an encode thread; returns the member's bytes. Heavy
  imports (PIL, PyAV) live inside it, so importing `sinks` stays cheap.

Bytes given as a payload are written as they are, whatever the extension (already encoded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Tuple

if TYPE_CHECKING:
    from sinks.config import SinkConfig

KINDS = ("image", "video", "audio", "json", "txt")


@dataclass(frozen=True)
class Encoder:
    kind: str
    extensions: Tuple[str, ...]
    check: Callable[[Any, str, str], Any]
    """(payload, ext, where) -> the payload to encode, or final bytes; ValueError on bad input."""
    encode: Callable[[Any, str, "SinkConfig"], bytes]
    """(checked payload, ext, config) -> member bytes; runs on an encode thread."""


_BY_EXT: Dict[str, Encoder] = {}
_LOADED = False


def register_encoder(encoder: Encoder) -> Encoder:
    if encoder.kind not in KINDS:
        raise ValueError(f"encoder kind {encoder.kind!r} is unknown; kinds: {', '.join(KINDS)}")
    for ext in encoder.extensions:
        if ext in _BY_EXT:
            raise ValueError(f"extension {ext!r} already has a {_BY_EXT[ext].kind} encoder")
    for ext in encoder.extensions:
        _BY_EXT[ext] = encoder
    return encoder


def suffix(ext: str) -> str:
    """The part of a member extension that names its format: `f0003.webp` -> `webp`."""
    return ext.rsplit(".", 1)[-1]


def encoder_for(ext: str) -> Encoder:
    _load_builtin()
    encoder = _BY_EXT.get(suffix(ext))
    if encoder is None:
        raise ValueError(f"member extension {ext!r} has no encoder; known: {', '.join(sorted(_BY_EXT))} "
                         f"(or pass the member's bytes already encoded)")
    return encoder


def known_extensions(kind: str | None = None) -> list[str]:
    _load_builtin()
    return sorted(e for e, enc in _BY_EXT.items() if kind is None or enc.kind == kind)


def check_payload(payload: Any, ext: str, where: str) -> Any:
    """The caller-thread half: bytes pass as they are; anything else goes to its kind's check."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    return encoder_for(ext).check(payload, ext, where)


def encode_payload(payload: Any, ext: str, config: "SinkConfig") -> bytes:
    """The encode-thread half: a checked payload -> bytes (bytes from `check_payload` pass)."""
    if isinstance(payload, bytes):
        return payload
    return encoder_for(ext).encode(payload, ext, config)


def _load_builtin() -> None:
    # The built-in kinds register themselves on import; imported here, lazily, because each of
    # them imports this module.
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from sinks import audio, encode, text, video  # noqa: F401
