"""Image encoders (the `image` kind): uint8 HxWx3 numpy array -> encoded bytes, one per format.

PIL is imported inside the encoder (webdataset's habit): importing `sinks` stays cheap, and PIL
releases the GIL while it compresses, which is what lets the sink's encode threads overlap.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Callable

import numpy as np

from sinks.config import IMAGE_FORMATS
from sinks.kinds import Encoder, register_encoder, suffix

if TYPE_CHECKING:
    from sinks.config import SinkConfig


def check_image(image: object, where: str) -> np.ndarray:
    """The image as a C-contiguous uint8 HxWx3 array, or ValueError naming what is wrong."""
    if not isinstance(image, np.ndarray):
        raise ValueError(f"{where}: image must be a numpy array, got {type(image).__name__}; "
                         f"convert tensors with .cpu().numpy().")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(
            f"{where}: image has dtype {image.dtype} and shape {image.shape}; "
            f"expected uint8 HxWx3 (RGB) with H, W > 0. "
            f"Scale floats with (x * 255).round().clip(0, 255).astype(np.uint8)."
        )
    return np.ascontiguousarray(image)


def _pil(image: np.ndarray):
    from PIL import Image

    # uint8 HxWx3 is read as RGB by every Pillow; the mode argument is deprecated since 11.3.
    return Image.fromarray(image)


def encode_jpg(image: np.ndarray, quality: int) -> bytes:
    out = io.BytesIO()
    _pil(image).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def encode_png(image: np.ndarray, quality: int) -> bytes:
    del quality  # png is lossless
    out = io.BytesIO()
    _pil(image).save(out, format="PNG")
    return out.getvalue()


def encode_webp(image: np.ndarray, quality: int) -> bytes:
    out = io.BytesIO()
    _pil(image).save(out, format="WEBP", quality=quality)
    return out.getvalue()


ENCODERS: dict[str, Callable[[np.ndarray, int], bytes]] = {"jpg": encode_jpg, "png": encode_png, "webp": encode_webp}
assert tuple(ENCODERS) == IMAGE_FORMATS


def encode_image(image: np.ndarray, fmt: str, quality: int) -> bytes:
    """Encode a checked uint8 HxWx3 array (see `check_image`) as `fmt`."""
    if fmt not in ENCODERS:
        raise ValueError(f"image format {fmt!r} is unknown; known formats: {', '.join(ENCODERS)}.")
    return ENCODERS[fmt](image, quality)


def _check(image: object, ext: str, where: str) -> np.ndarray:
    return check_image(image, where)


def _encode(image: np.ndarray, ext: str, config: "SinkConfig") -> bytes:
    # The member's own extension names the format (a video's `f0003.webp` frames are webp whatever
    # sink.format is); sink.quality applies to every lossy image.
    return encode_image(image, suffix(ext), config.quality)


register_encoder(Encoder("image", IMAGE_FORMATS, _check, _encode))
