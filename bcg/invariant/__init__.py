"""bcg.invariant: batch-invariant kernels, so a row's output bytes do not depend on its batch.

BLAS, cuBLAS, oneDNN, cuDNN and aten's reductions choose kernels, tilings and reduction splits from
the whole problem's shape, the batch included, so the same row gets other bits at batch 1 and 8.
While the mode is installed (process-wide, every thread) those ops compute each row the same way
whatever the batch size, the neighbours or the row's position:

    from bcg.invariant import batch_invariant
    with batch_invariant() as inv:          # or: inv = install_batch_invariance(); ...; inv.remove()
        images = pipe(...)                  # every GEMM, convolution, reduction of the call
    inv.stats()                             # {"calls": {"cpu.addmm": 120, ...}}

Install it before the bcg runner captures a graph: replay then records the invariant kernels.
Bytes still depend on the device, the software stack and, on the CPU, the thread count.

Files: mode (config, installer, CPU registrations), cpu (fixed-shape CPU GEMM / bmm, per-item SDPA), conv (per
sample, 1x1 as GEMM), gemm_triton (the M-invariant persistent Triton GEMM), reduce_triton (row
sum / mean), cuda_ops (CUDA registrations), attention (CUDA SDPA row by row, the whole batch where
that gave the same bits), verified (cuBLAS / cuDNN for a call shape where they gave the canonical
kernel's bits), kept (those verdicts kept across runs, re-checked by a fingerprint), checksum_triton
(that fingerprint's sums in one pass on CUDA), trace (op-by-op
comparison: where a row first depends on its batch). Mechanism only: nothing here knows prompts, jobs or model families.
"""

from .mode import BatchInvariance, InvariantConfig, active, batch_invariant, install_batch_invariance
from .trace import RowReport, compare_rows

__all__ = ["BatchInvariance", "InvariantConfig", "RowReport", "active", "batch_invariant", "compare_rows",
           "install_batch_invariance"]
