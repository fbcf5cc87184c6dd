"""The state of a pipeline's torch modules before a job runs them: owned weights, eval mode.

Owned weights. `from_pretrained` leaves CPU tensors inside the memory-mapped safetensors file,
at whatever address the file layout gives them (often not 64-byte aligned: `data_ptr() % 64 ==
24` for the Flux tiny transformer). On some CPUs (AMD EPYC, AVX2) oneDNN/MKL take another kernel
path for misaligned operands and round differently, so a loaded checkpoint gave other images than
the same weights built in memory (issue 16). `own_weights` copies every parameter and buffer
into fresh storage from torch's CPU allocator (64-byte aligned), which also releases the file
mapping. On CUDA nothing is done here: `pipe.to(device)` already copies each tensor into fresh
memory from the caching allocator (256-byte aligned at least) and drops the mapped CPU tensor
(tests/gpu/test_weights_gpu.py checks both).

Eval mode. diffusers and transformers put a model in eval mode after `from_pretrained`, but a
module built from its config starts in training mode (dropout on), so the tiny presets would run
differently from their real models. Every pipeline goes through `eval_mode`.

No KV cache in a text encoder run once for its hidden states. A decoder LM used as a text encoder
(SANA's Gemma2, Qwen-Image's Qwen2.5-VL, Z-Image's Qwen3, LTX-2's Gemma3) builds a KV cache on
every forward when its config says `use_cache`, and nothing ever reads it. Gemma2's sliding-window
layers also copy a CPU tensor to the device as each layer's cache starts (a copy from pageable
memory first synchronises its stream): 13 host syncs per encode on Gemma2-2B, where the SANA job's
prefetch thread spent a quarter of its time on the H200 (py-spy,
benchmarks/results/job_wall_h200_spy_s26.md). `forward_only` turns the cache off; the embeddings are
the same bytes (tests/test_models_weights.py compares every family's encode both ways, and
tests/gpu/test_weights_gpu.py on CUDA in bfloat16).
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Union

import torch

log = logging.getLogger(__name__)

#: c10's CPU allocator aligns every allocation to 64 bytes (c10/core/alignment.h).
CPU_ALIGNMENT = 64


def torch_modules(pipe) -> Dict[str, torch.nn.Module]:
    """The pipeline's components that are torch modules (transformer, vae, text encoders...)."""
    return {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def eval_mode(pipe) -> None:
    """Every component in eval mode with its weights frozen (requires_grad off).

    Freezing is not for memory (the job runs under inference_mode, which records no graph either
    way) but for the kernels: `torch.matmul(x, w.t())` with a strided 3-D `x` folds `x` into a 2-D
    copy whenever `w` requires grad, for backward's sake, whatever the grad mode (ATen's should_fold);
    with `w` frozen it runs one batched GEMM on the strided layout. `from_pretrained` leaves weights
    trainable, so SANA's attention out-projection, whose input is the linear attention's [B, D, N]
    memory, copied 73 MB before each of its 20 GEMMs a SANA-1.6B forward at 1024², batch 8
    (benchmarks/results/job_wall_h200_1024_s38trace.md: about 5% of a steady batch)."""
    for module in torch_modules(pipe).values():
        module.eval()
        module.requires_grad_(False)


def forward_only(pipe, names: Iterable[str]) -> List[str]:
    """`use_cache` off in the configs (a multimodal model's text_config too) of the components
    `names` that the pipeline only runs forward; returns the "component.config" keys it set."""
    changed = []
    for name in names:
        module = getattr(pipe, name, None)
        config = getattr(module, "config", None)
        for where, c in (("config", config), ("config.text_config", getattr(config, "text_config", None))):
            if c is not None and getattr(c, "use_cache", False):
                c.use_cache = False
                changed.append(f"{name}.{where}")
    return changed


def owns_aligned_memory(t: torch.Tensor) -> bool:
    """t sits alone at the start of a storage torch allocated, at an aligned address.

    Storage over an external buffer (a memory-mapped file, `torch.frombuffer`) is not resizable.
    """
    s = t.untyped_storage()
    return (t.device.type != "cpu" or s.resizable()) and t.storage_offset() == 0 and (
        t.data_ptr() % CPU_ALIGNMENT == 0 or t.numel() == 0)


def own_weights(pipe, device: Union[str, torch.device]) -> int:
    """For a CPU run: every parameter and buffer into fresh, owned, aligned memory. Returns bytes copied."""
    if torch.device(device).type != "cpu":
        return 0  # the copy to the device does it (module docstring)
    copied = 0
    with torch.no_grad():
        copied += _replace_view_buffers(pipe)
        for module in torch_modules(pipe).values():
            # parameters()/buffers() yield a tied tensor once, so ties survive (`.data` is swapped in place).
            for t in list(module.parameters()) + list(module.buffers()):
                if t.device.type != "cpu":
                    continue
                # One tensor at a time: peak memory is the model plus its largest tensor, since the
                # mapped pages are file cache the kernel can drop.
                t.data = t.data.clone(memory_format=torch.contiguous_format)
                copied += t.nbytes
                assert owns_aligned_memory(t), "torch's CPU allocator returned unaligned memory"
    log.debug("copied %.1f MiB of weights out of the checkpoint's file mapping", copied / 2**20)
    return copied


def _replace_view_buffers(pipe) -> int:
    """Buffers loaded by assignment are the state dict's tensors: views of the file's tensors
    (LTX-2's VAE statistics). `.data =` swaps a view's storage but keeps its `_base`, and with it
    the file mapping, so a view buffer is replaced in its module instead (one copy per tensor, so
    a buffer shared by two modules stays shared)."""
    fresh: Dict[int, torch.Tensor] = {}
    copied = 0
    for module in torch_modules(pipe).values():
        for sub in module.modules():
            for name, b in list(sub._buffers.items()):
                if b is None or b.device.type != "cpu" or not b._is_view():
                    continue
                if id(b) not in fresh:
                    fresh[id(b)] = b.detach().clone(memory_format=torch.contiguous_format)
                    copied += b.nbytes
                sub._buffers[name] = fresh[id(b)]
    return copied
