"""What, beyond the config, decides a CPU run's bytes: the intra-op thread count.

oneDNN and MKL split a GEMM across threads and reduce the partial sums in an order that follows
the split, so the same pipeline gives other floats at 1 thread than at 2 (measured on the tiny
SANA and Flux presets: up to 7e-7, enough to change a uint8 pixel in ~100k). A CPU run that
resumes with another thread count would mix two renderings in one output_dir, so the count is
part of a CPU run's identity. CUDA kernels do not depend on it: a GPU run leaves it out, and may
resume on a host with any number of cores.
"""

from __future__ import annotations


def cpu_identity(device: str) -> dict:
    """{"cpu_threads": n} for a run on the CPU (`device` as configured: auto, cpu or cuda); {} otherwise."""
    import torch

    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return {"cpu_threads": torch.get_num_threads()} if on_cpu else {}
