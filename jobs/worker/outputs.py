"""A batch's outputs on their way to the sink: pixels, finite flags, and what a family makes beside them.

    decode -> Decoded (images, optional audio)     the family (jobs/models/)
           -> Generated on the device              `on_device`: uint8 pixels, cleaned audio, flags
           -> host tensors (pinned, non-blocking)  `Generated.to_host`, then an event
           -> numpy per item                       `HostOutputs.item_audio`

Audio follows the pixels' rule (jobs/worker/pixels.py): NaN becomes 0, +-Inf +-1, samples are clipped to
[-1, 1], and an item with any non-finite sample is flagged like a non-finite image; the wav encoder
(sinks/audio.py) then scales to int16 by one rounding rule, so equal waveforms give equal bytes.
Per-item json fields (`DenoiseRequest.meta`, e.g. GLM-Image's prior digest) ride along as dicts.

The denoised latents ride along too: every tensor the family's `denoise` returned (`tensors_of`),
batch-first, dropped to the real rows with the pixels, copied to the host with them (pinned,
non-blocking, on the decode stream after the decode, which only reads them), and hashed there per
row once the copy is done (`latent_sha256`): no host sync in the denoise loop, and no more than the
latents' bytes cross (a few KB a row at 64², ~0.5 MB at SANA's 1024²).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import List, Optional

import numpy as np
import torch

from jobs.models.base import Decoded
from jobs.worker.pixels import to_uint8_torch


@dataclass
class Generated:
    pixels: torch.Tensor  # uint8 [B, H, W, 3] or [B, F, H, W, 3]
    finite: torch.Tensor  # bool [B]
    audio: Optional[torch.Tensor] = None  # float32 [B, N, C] in [-1, 1] (frames by channels, as a wav holds them)
    sample_rate: int = 0
    meta: List[dict] = field(default_factory=list)  # one dict per row, or empty
    latents: List[torch.Tensor] = field(default_factory=list)  # the denoised latents, each [B, ...] (`tensors_of`)

    def head(self, n: int) -> "Generated":
        """The first n rows (the batch's real items: dummy rows are dropped before the host copy)."""
        return replace(self, pixels=self.pixels[:n], finite=self.finite[:n],
                       audio=None if self.audio is None else self.audio[:n], meta=self.meta[:n],
                       latents=[t[:n] for t in self.latents])

    def to_host(self, cuda: bool):
        """Start copying to the host; returns (HostOutputs, event marking the copies' end or None)."""
        extra = [self.audio] if self.audio is not None else []
        tensors = [self.pixels, self.finite] + extra + list(self.latents)
        if not cuda:
            host = tensors
            done = None
        else:
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for h, t in zip(host, tensors):
                h.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        audio = host[2] if self.audio is not None else None
        return HostOutputs(host[0], host[1], audio, self.sample_rate, list(self.meta),
                           latents=host[2 + len(extra):]), done


@dataclass
class HostOutputs:
    """Host copies (valid once the copy event has been reached)."""

    pixels: torch.Tensor
    finite: torch.Tensor
    audio: Optional[torch.Tensor]
    sample_rate: int
    meta: List[dict]
    latents: List[torch.Tensor] = field(default_factory=list)

    def item_latent_sha256(self) -> List[str]:
        """Each row's digest of its denoised latents (`latent_sha256`); "" where the family returned none."""
        return [latent_sha256(self.latents, i) if self.latents else "" for i in range(len(self.pixels))]

    def item_audio(self) -> List[Optional[np.ndarray]]:
        n = len(self.pixels)
        if self.audio is None:
            return [None] * n
        audio = self.audio.numpy()
        return [audio[i].copy() for i in range(n)]

    def item_meta(self) -> List[dict]:
        return [dict(m) for m in self.meta] if self.meta else [{} for _ in range(len(self.pixels))]


def on_device(decoded: "torch.Tensor | Decoded", meta: List[dict], latents=None) -> Generated:
    """A family's decode output (and the latents its denoise returned) -> Generated, where it lives;
    no host sync."""
    if not isinstance(decoded, Decoded):
        decoded = Decoded(images=decoded)
    pixels, finite = to_uint8_torch(decoded.images)
    audio = None
    if decoded.audio is not None:
        audio, audio_ok = clean_audio(decoded.audio)
        finite = finite & audio_ok
    rows = tensors_of(latents)
    assert all(t.dim() and t.shape[0] == len(pixels) for t in rows), (
        f"the family's latents {[tuple(t.shape) for t in rows]} are not batch-first for its {len(pixels)} rows")
    return Generated(pixels, finite, audio, int(decoded.sample_rate), list(meta), latents=rows)


def clean_audio(audio: torch.Tensor):
    """[B, C, N] float -> (float32 [B, N, C] in [-1, 1], finite [B] bool)."""
    x = audio.float().transpose(1, 2)
    finite = torch.isfinite(x).flatten(1).all(dim=1)
    x = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0).clamp_(-1.0, 1.0)
    return x.contiguous(), finite


def cat(a: Generated, b: Generated) -> Generated:
    """Two halves of an out-of-memory split, in order."""
    audio = None
    if a.audio is not None:
        if b.audio is None:  # one family decoded both halves: audio for both, or for neither
            raise TypeError("cat: the first half of a split batch has audio, the second has none")
        audio = torch.cat([a.audio, b.audio])
    return Generated(torch.cat([a.pixels, b.pixels]), torch.cat([a.finite, b.finite]), audio,
                     a.sample_rate or b.sample_rate, list(a.meta) + list(b.meta),
                     latents=[torch.cat([x, y]) for x, y in zip(a.latents, b.latents)])


def ran_at(g: Generated, batch_size: int) -> Generated:
    """`g` with each row's json `batch_size` set to the size it ran at, where an inner split has not set a
    smaller one: after an out-of-memory split a row's bytes follow its half's shape, not the pool's, and
    its json says so (the batch's own size otherwise, jobs/worker/samples.py)."""
    meta = [dict(m) for m in g.meta] if g.meta else [{} for _ in range(len(g.pixels))]
    for m in meta:
        m.setdefault("batch_size", batch_size)
    return replace(g, meta=meta)


def latent_sha256(latents: List[torch.Tensor], row: int) -> str:
    """sha256 of row `row` of every latent tensor, in order: for each, its dtype and the row's shape
    as ASCII (`float32[32, 2, 2]`), then the row's bytes, C-contiguous, in the host's byte order
    (little-endian on x86 and ARM). Host tensors only (after the copy): hashing reads every byte."""
    h = hashlib.sha256()
    for t in latents:
        r = t[row].contiguous()
        h.update(f"{str(r.dtype).removeprefix('torch.')}{list(r.shape)}".encode())
        # A view of the row's bytes: no copy. numpy's stubs give ndarray __buffer__ only for
        # Python >= 3.12 (mypy checks as 3.10), though every ndarray exports the buffer protocol.
        h.update(r.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    return h.hexdigest()


def tensors_of(obj) -> List[torch.Tensor]:
    """The tensors in a family's latents (a tensor, or a tuple/list of them and other values)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_of(o)]
    return []
