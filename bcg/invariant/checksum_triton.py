"""kept.checksum's three sums in one pass (Triton, CUDA): the same integers, a fraction of the work.

kept.checksum sums a tensor's int16 lanes plainly, weighted by a ramp (lane i's weight is i % 251 + 1)
and squared. In torch that is a chunk at a time: each 4M-lane chunk made into int64, its ramp built
and multiplied, three reductions, about ten passes over 32 MB and eight launches a chunk. A kept
verdict's re-check pays it on the vendor kernel's output at the key's probe, and the VAE's largest
outputs at 1024², batch 8, are 2^30 lanes: 0.6 s of a SANA-1.6B job's first batch went to checksums
on an H100 host (py-spy, `benchmarks/results/job_wall_spy_1024_s57.md`). Here each program reads its
span of lanes once and keeps the three sums in int64 registers; the partial sums are added by torch
in int64 and read back once.

Exact, so equal to the torch path whatever the order: every term is an integer (|lane| <= 2^15, so
lane^2 <= 2^30 and |lane x weight| < 2^23), a program sums at most 2^14 lanes (under 2^44 each), and
a launch covers at most 2^32 lanes, whose sums stay under 2^62. Longer tensors take several launches,
added up as Python ints by the caller (kept.checksum), as the torch path adds its chunks. Kept
fingerprints stay valid: tests/gpu/test_invariant_kept_gpu.py compares the two paths bit for bit.
"""

from __future__ import annotations

from typing import List

import torch
import triton
import triton.language as tl

BLOCK = 1024  # lanes a program reads at a time
ITERS = 16  # blocks a program sums: 2^14 lanes
LAUNCH = 1 << 32  # lanes a launch covers at most: its int64 totals cannot overflow


@triton.jit
def _sums_kernel(lanes_ptr, out_ptr, n, first, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    plain = tl.zeros((BLOCK,), dtype=tl.int64)
    ramped = tl.zeros((BLOCK,), dtype=tl.int64)
    squared = tl.zeros((BLOCK,), dtype=tl.int64)
    for it in range(ITERS):
        offs = (pid * ITERS + it) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        c = tl.load(lanes_ptr + offs, mask=offs < n, other=0).to(tl.int64)  # masked lanes add nothing
        ramp = (first + offs) % 251 + 1  # the lane's place in the whole tensor, not in this launch
        plain += c
        ramped += c * ramp
        squared += c * c
    tl.store(out_ptr + pid * 3, tl.sum(plain, axis=0))
    tl.store(out_ptr + pid * 3 + 1, tl.sum(ramped, axis=0))
    tl.store(out_ptr + pid * 3 + 2, tl.sum(squared, axis=0))


def lane_sums(lanes: torch.Tensor) -> List[torch.Tensor]:
    """The three sums over 1-D int16 `lanes` (on a CUDA device; on the CPU under Triton's interpreter), as
    one int64 tensor [3] a launch, not read back: the caller reads them all at once."""
    assert lanes.dim() == 1 and lanes.dtype == torch.int16, (lanes.shape, lanes.dtype)
    out = []
    span = BLOCK * ITERS
    for first in range(0, lanes.numel(), LAUNCH):
        part = lanes[first:first + LAUNCH]
        programs = triton.cdiv(part.numel(), span)
        partial = torch.empty((programs, 3), dtype=torch.int64, device=lanes.device)
        _sums_kernel[(programs,)](part, partial, part.numel(), first, BLOCK=BLOCK, ITERS=ITERS, num_warps=4)
        out.append(partial.sum(0))
    return out
