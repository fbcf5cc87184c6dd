"""Float images -> uint8 pixels and a finite flag per image: one rule, on the host or the device.

The rule (NaN -> 0, +Inf -> 1, -Inf -> 0, clip to [0, 1], x * 255 + 0.5, truncate) is written
twice: in numpy for the serial reference path, and in torch so the job converts on the GPU and
moves 1 byte a channel to the host instead of 4. Each step is one float32 op in both, with no
fused multiply-add between the multiply and the add, so both give the same bytes
(tests/test_stages.py checks it on the CPU, tests/gpu/test_stages_gpu.py on the GPU).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch


def to_uint8(image: np.ndarray) -> np.ndarray:
    """[..., H, W, 3] float in [0, 1] -> uint8; NaN/Inf become 0 or 1 (the item is flagged separately)."""
    clean = np.nan_to_num(image, nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(clean, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def to_uint8_torch(images: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """[B, 3, H, W] (images) or [B, F, 3, H, W] (videos) float in [0, 1] -> (uint8 [B, H, W, 3] or
    [B, F, H, W, 3], finite [B] bool), where `images` lives.

    No host sync: both results stay on the device until the caller copies them."""
    x = images.movedim(-3, -1).float()  # channels last: what diffusers' pt_to_numpy hands the numpy rule
    finite = torch.isfinite(x).flatten(1).all(dim=1)
    x = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0).clamp_(0.0, 1.0)
    return (x * 255.0 + 0.5).to(torch.uint8), finite
