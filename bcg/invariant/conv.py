"""Batch-invariant convolution and group norm: one sample per call, or a 1x1 convolution as an
invariant GEMM.

oneDNN and cuDNN choose a convolution's algorithm (and its blocking, so its reduction order) from
the whole input shape, minibatch included, so a sample's output changes with N. Per sample, the
shape a sample meets is the same in every batch: the algorithm is fixed by construction (with
cuDNN's benchmark off, since a benchmarked pick is a timing). A pointwise convolution is a GEMM
over pixels, and runs as one through the mode's invariant GEMM, in one call for the whole batch.
Each sample is copied to a fresh contiguous buffer first: a fresh buffer starts on the
allocator's alignment whatever the sample's offset in the batch (MKL's results were measured to
depend on alignment, cpu.py), and a batch can arrive in another layout than a single sample
(AutoencoderKL's attention hands its next convolution a channels-last view for B > 1 and a plain
one for B = 1) and the layout picks the algorithm too. The output keeps the memory format aten
would give (channels-last in, channels-last out). Group norm (CPU: its kernel splits the work by
N x groups) is per sample for the same reasons.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch


def _format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def is_pointwise(weight: torch.Tensor, stride, padding, dilation, transposed: bool, groups: int) -> bool:
    return (not transposed and groups == 1 and weight.dim() == 4 and tuple(weight.shape[2:]) == (1, 1)
            and all(s == 1 for s in stride) and all(p == 0 for p in padding))


def pointwise(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
              gemm: Callable[..., torch.Tensor]) -> torch.Tensor:
    """1x1 convolution, stride 1, no padding, one group: [N*H*W, C] @ [C, O] (+ bias) by `gemm`."""
    nb, c, h, w = x.shape
    o = weight.shape[0]
    rows = x.permute(0, 2, 3, 1).reshape(nb * h * w, c)
    y = gemm(rows, weight.reshape(o, c).t(), bias)
    y = y.reshape(nb, h, w, o).permute(0, 3, 1, 2)
    return y.contiguous(memory_format=_format(x))


def per_sample(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
               groups: int, canonical: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """aten::convolution, one sample a call (aten::_convolution, which the mode leaves in place), each
    sample copied to a fresh buffer in the `canonical` layout (CUDA: channels-last, cuDNN's fast one)."""
    flags = dict(benchmark=False, deterministic=True, cudnn_enabled=torch.backends.cudnn.enabled,
                 allow_tf32=torch.backends.cudnn.allow_tf32)
    fmt = _format(x)
    out = None
    for i in range(x.shape[0]):
        xi = x[i:i + 1].clone(memory_format=canonical if x.dim() == 4 else torch.contiguous_format)
        y = torch.ops.aten._convolution.default(xi, weight, bias, stride, padding, dilation, transposed,
                                                output_padding, groups, *flags.values())
        if out is None:
            out = torch.empty((x.shape[0], *y.shape[1:]), dtype=y.dtype, device=y.device, memory_format=fmt)
        out[i:i + 1].copy_(y)
    if out is None:  # an empty batch: aten's own answer for its shape
        out = torch.ops.aten._convolution.default(x, weight, bias, stride, padding, dilation, transposed,
                                                  output_padding, groups, *flags.values())
    return out


def batched(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
            padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
            groups: int, canonical: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """The same convolution as `per_sample` (flags, a fresh buffer in the `canonical` layout, the output in
    x's format), the whole batch in one call: not invariant by construction, so the mode runs it only
    where it gave per_sample's bits (verified.py)."""
    flags = dict(benchmark=False, deterministic=True, cudnn_enabled=torch.backends.cudnn.enabled,
                 allow_tf32=torch.backends.cudnn.allow_tf32)
    xb = x.clone(memory_format=canonical if x.dim() == 4 else torch.contiguous_format)
    y = torch.ops.aten._convolution.default(xb, weight, bias, stride, padding, dilation, transposed,
                                            output_padding, groups, *flags.values())
    return y.contiguous(memory_format=_format(x))


def group_norm_per_sample(x: torch.Tensor, groups: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                          eps: float) -> torch.Tensor:
    """aten::group_norm, one contiguous sample a call of aten::native_group_norm (left in place)."""
    n, c = x.shape[0], x.shape[1]
    hw = x[0, 0].numel() if n else 0
    out = torch.empty_like(x, memory_format=_format(x))
    for i in range(n):
        xi = x[i:i + 1].clone(memory_format=torch.contiguous_format)
        y = torch.ops.aten.native_group_norm.default(xi, weight, bias, 1, c, hw, groups, eps)[0]
        out[i:i + 1].copy_(y)
    return out
