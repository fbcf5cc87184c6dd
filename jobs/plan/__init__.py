"""The plan's vocabulary, shared by both roles: Signature, Item, Batch, and cutting a run into batches.

Sorting by signature is what makes graphs pay: each captured graph replays across one long run of
same-signature batches, and is released when the run ends. The planner role lives in this package
(`python -m jobs.plan`: build.py streams the dataset into signature-pure work units, units.py is
their format, identity.py the run's identity, publish.py joins or makes the plan of an output_dir);
the worker role (jobs/worker/) leases units and cuts them into batches. The plan is a pure function
of the dataset, the config and the tokenizer: the same inputs give the same units on any machine,
with any number of planner processes.

May import: jobs.config, jobs.errors, jobs.preflight, jobs/dataset/, jobs/models/ (text lengths),
jobs/output/ (claim, layout, lease files), padding/, sinks/; never the worker or telemetry.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, order=True, slots=True)
class Signature:
    """The graph key the plan can enumerate: everything that changes a denoiser call's shapes or constants."""

    height: int
    width: int
    text_bucket: int
    steps: int
    guidance_scale: float
    cfg: bool
    dtype: str
    frames: int = 1  # a video's frames; 1 for an image

    def __str__(self) -> str:
        g = f"cfg{self.guidance_scale:g}" if self.cfg else "nocfg"
        f = f"/f{self.frames}" if self.frames > 1 else ""  # image signatures read as they always have
        return f"{self.height}x{self.width}{f}/t{self.text_bucket}/s{self.steps}/{g}/{self.dtype}"


@dataclass(frozen=True, slots=True)  # slots: a plan holds millions of these
class Item:
    key: str
    prompt: str
    negative_prompt: str
    seed: int
    signature: Signature
    text_tokens: int  # used text positions (positive and, with CFG, negative: the larger)
    truncated: bool
    source: str
    fps: Optional[float] = None  # a video's playback rate (not the signature's: the denoiser never sees it)
    extra: Optional[str] = None  # JSON object of the row's dataset.keep_fields, passed through to its json


@dataclass
class Batch:
    signature: Signature
    items: List[Item]
    size: int  # the pool batch size this batch runs at (>= len(items) when padded)

    @property
    def n_dummy(self) -> int:
        return self.size - len(self.items)


def derive_seed(job_seed: int, key: str) -> int:
    """A seed from (job seed, key) alone: the same key gets the same noise in any batch or order."""
    digest = hashlib.sha256(f"{job_seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: fits torch.Generator.manual_seed


def derive_seeds(job_seed: int, keys) -> Tuple["np.ndarray", "np.ndarray"]:
    """derive_seed of every key of an Arrow string array (int64), and a 64-bit hash of each key
    (uint64: the digest's next 8 bytes) for the planner's uniqueness check: one sha256 per key,
    with no Python object per row but the key's bytes and its digest."""
    import numpy as np
    import pyarrow as pa

    prefix, sha = f"{job_seed}\x00".encode(), hashlib.sha256
    blob = b"".join([sha(prefix + k).digest() for k in keys.cast(pa.binary()).to_pylist()])
    d = np.frombuffer(blob, ">u8").reshape(-1, 4)
    return (d[:, 0] >> np.uint64(1)).astype(np.int64), d[:, 1].astype(np.uint64)


def cut_batches(items: Sequence[Item], sizes: Sequence[int], pad_short: bool) -> List[Tuple[List[Item], int]]:
    """Greedy largest-first cut of one signature run; a tail smaller than every size is padded up."""
    sizes = sorted({int(s) for s in sizes}, reverse=True)
    out, i = [], 0
    while i < len(items):
        left = len(items) - i
        fit = next((s for s in sizes if s <= left), None)
        if fit is None:  # tail shorter than the smallest pool size
            size = sizes[-1] if pad_short else left
            out.append((list(items[i:]), size))
            break
        out.append((list(items[i:i + fit]), fit))
        i += fit
    return out
