"""Kinds of GPU kernel, by name: how the profiles and the fused-family table split a step's time."""

from __future__ import annotations

# Kinds of kernel, by name (first match wins). bcg's Triton kernels are its jit functions
# (`_adaln_kernel`, ...); Inductor names its own `triton_poi_...`, `triton_red_...`, `triton_per_...`.
KINDS = (
    ("copy", ("memcpy", "Memcpy", "memset", "Memset", "copy_kernel", "CatArrayBatchedCopy")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa")),
    ("convolution", ("conv", "cudnn", "implicit", "depthwise", "xmma_fprop", "winograd")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas", "Kernel2")),
    ("triton (inductor)", ("triton_",)),
    ("aten norm", ("layer_norm", "LayerNorm", "rms_norm")),
    ("aten reduction", ("reduce_kernel", "reduce")),
    ("aten elementwise", ("elementwise", "vectorized", "unrolled")),
)


def kind_of(name: str) -> str:
    if name.startswith("_") and name.endswith("_kernel"):
        return "triton (bcg)"
    for kind, needles in KINDS:
        if any(n in name for n in needles):
            return kind
    return "other"
