"""One generated item -> the `sinks.Sample` the job writes: which members, and what its json says.

An item of one frame is an image, `KEY.<sink.format>`, whatever its family. An item of more frames
is a video: `KEY.mp4` at the item's fps (H.264, sinks/video.py), and with `sink.video_frames` each
frame too, `KEY.fNNNN.<fmt>`. The json of a video adds `num_frames` and `fps`; an image's json is
what it always was (plus `latent_sha256`). A family that makes sound (LTX-2) adds `KEY.wav` (16-bit PCM, sinks/audio.py)
beside the mp4, and its json the rate, sample count and channels.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

import numpy as np

from jobs.plan import Item
from sinks import Audio, Sample, SinkConfig, Video

DEFAULT_FPS = 16.0  # items planned before fps existed (their units have no fps column)


def item_meta(it: Item, model: str, mode: str, batch_size: int, finite: bool, latent_sha256: str) -> dict:
    """`latent_sha256`: the digest of the item's denoised latents (jobs/worker/outputs.py), the record
    `jobs.verify --against` compares two runs by."""
    s = it.signature
    meta = {
        "key": it.key, "prompt": it.prompt, "negative_prompt": it.negative_prompt, "seed": it.seed,
        "width": s.width, "height": s.height, "steps": s.steps, "guidance_scale": s.guidance_scale,
        "cfg": s.cfg, "dtype": s.dtype, "model": model, "text_tokens": it.text_tokens,
        "bucket": s.text_bucket, "signature": str(s), "mode": mode, "batch_size": batch_size,
        "truncated": it.truncated, "nonfinite": not finite, "source": it.source,
        "latent_sha256": latent_sha256,
    }
    if s.frames > 1:
        meta.update(num_frames=s.frames, fps=item_fps(it))
    if it.extra:
        meta.update(json.loads(it.extra))  # dataset.keep_fields: names the json does not use (checked at start)
    return meta


def item_fps(it: Item) -> float:
    return DEFAULT_FPS if it.fps is None else float(it.fps)


def frame_ext(index: int, fmt: str) -> str:
    return f"f{index:04d}.{fmt}"


def item_sample(it: Item, pixels: np.ndarray, meta: dict, sink: SinkConfig, audio: Optional[np.ndarray] = None,
                sample_rate: int = 0) -> Sample:
    """`pixels`: uint8 [H, W, 3] (an image family) or [F, H, W, 3] (a video family); `audio`: the
    item's soundtrack, float [N, C] in [-1, 1] at `sample_rate` (LTX-2), written as KEY.wav."""
    if pixels.ndim == 4 and pixels.shape[0] == 1:
        pixels = pixels[0]  # a video family's single frame is an image
    sound = {} if audio is None else {"wav": Audio(audio, int(sample_rate))}
    if audio is not None:
        meta = dict(meta, audio_sample_rate=int(sample_rate), audio_samples=int(audio.shape[0]),
                    audio_channels=int(audio.shape[1]))
    if pixels.ndim == 3:
        return Sample(key=it.key, image=pixels, caption=it.prompt, meta=meta, media=sound)
    media: Dict[str, Any] = {"mp4": Video(pixels, item_fps(it))}  # Sample.media's type: any member
    if sink.video_frames != "none":
        media.update({frame_ext(i, sink.video_frames): frame for i, frame in enumerate(pixels)})
    media.update(sound)
    return Sample(key=it.key, caption=it.prompt, meta=meta, media=media)


def sample_kind(sample: Sample) -> str:
    """"video" for a sample with a KEY.mp4, else "image" (the closing summary counts them by kind)."""
    return "video" if "mp4" in sample.media else "image"
