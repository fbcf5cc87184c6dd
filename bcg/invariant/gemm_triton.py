"""A GEMM whose every output element is reduced the same way whatever M is (Triton).

    out = alpha * (a @ b) + beta * bias        a [M, K] | [B, M, K], b [K, N] | [B, K, N]

Why it is batch-invariant: one program owns one output tile and walks the whole K dimension in
order, into one fp32 accumulator (no split-K, no stream-K, no atomics), so an output element's sum
has the same terms in the same order for M = 1 and M = 8192, at any row of any tile; rows past M
are masked loads of zeros that never meet a valid row's sum. The persistent loop (a fixed grid of
NUM_SMS programs striding over tiles) only decides *which* program computes a tile, not how. M is
not specialised (`do_not_specialize`): Triton would otherwise compile another kernel for M == 1.

The tile is a speed choice, not part of the sum. Each element is the same chain of MMA k-steps
into its accumulator whatever the tile's rows, columns, K chunk, warps or stages: on the H200,
308 of 308 (shape, tile) pairs at SANA-1.6B's and Flux's GEMMs gave the canonical tile's bits
(benchmarks/results/gemm_tiles_h200.md). So `tile_for` may follow M (a 128x256 tile at M = 512
leaves 96 of 132 SMs idle), and the contract rests on that measured fact, guarded twice:
- at run time, the first call of each (dtype, N, K, tile, bias) outside a graph capture also runs
  the canonical tile (`canonical_tile`, a function of dtype, N and K alone) and compares bit for
  bit; a tile that differs is dropped for that key for good and the canonical tile's bytes are
  returned (`_TileVerdicts`). Until a tile is verified (during a capture, say) the canonical one runs.
- tests/gpu/test_batch_invariance_gpu.py requires every tile `tile_for` picks at the real shapes to
  equal the canonical one, so a Triton or driver change that broke the fact fails a test.
fp32 (the CPU interpreter's IEEE path, where numpy's block products do depend on the block) keeps
the canonical tile at every M.

The epilogue keeps cuBLAS's rounding plan (fp32 accumulate, alpha/beta in fp32, one rounding to
the output dtype), so outputs are close to cuBLAS's but not its bits: invariance, not equality.

Tiles are a fixed table, not Triton's autotuner: an autotuned pick is a timing, and the contract
says no byte depends on a timing. Runs on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1
(the CPU tests; fp32 there, with input_precision "ieee").
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


def canonical_tile(dtype: torch.dtype, n: int, k: int) -> Tile:
    """The reference tile for this dtype, N and K: never a function of M. Every other tile's bytes
    are checked against it (`_TileVerdicts`)."""
    if dtype == torch.float32:
        # fp32 runs as IEEE FMA (no TF32): smaller tiles, and what the interpreter runs in tests.
        return Tile(32, 32, 32, group_m=8, num_warps=4, num_stages=2)
    if n <= 128:
        return Tile(128, 64, 64, num_warps=4, num_stages=4)
    # bf16/fp16 on Hopper: 128x256 tiles need wgmma's full width; K step 64 keeps 3 stages in SMEM.
    return Tile(128, 256 if n >= 2048 else 128, 64, num_warps=8, num_stages=3)


def tile_for(dtype: torch.dtype, m: int, n: int, k: int, items: int = 1, sms: int = 132) -> Tile:
    """The fastest tile measured for this GEMM (benchmarks/results/gemm_tiles_h200.md), M included:
    a speed choice only, since no tile changes an element's bits (the module's docstring)."""
    if dtype == torch.float32:
        return canonical_tile(dtype, n, k)
    narrow = n <= 128
    bn = 64 if narrow else 256 if n >= 16384 else 128
    if m <= 16:  # the modulation and timestep GEMMs (M = the batch): mma tiles of 16 rows
        return Tile(16, bn, 64, num_warps=4, num_stages=4)
    if m <= 64:
        return Tile(64, bn, 64, num_warps=4, num_stages=4)
    if narrow:
        return canonical_tile(dtype, n, k)
    if items * -(-m // 128) * -(-n // 256) < sms:  # under one wave of 128x256 tiles: halve them
        return Tile(128, 128, 64, num_warps=8, num_stages=3)
    return Tile(128, 256, 32, num_warps=8, num_stages=4)


class _TileVerdicts:
    """Whether a tile gave the canonical tile's bytes, per (dtype, N, K, tile, bias), found on the
    first call outside a capture and kept for the process. Thread-safe: the job's stages run on
    threads of their own."""

    def __init__(self) -> None:
        self._agrees: dict[tuple, bool] = {}
        self._lock = threading.Lock()

    def run(self, key: tuple, fast: Tile, canon: Tile, launch: Callable[[Tile, torch.Tensor], None],
            out: torch.Tensor) -> None:
        """Write the product into `out` with `fast` where it is known to agree, else the canonical tile."""
        verdict = self._agrees.get(key)
        if verdict is not None or _capturing(out):
            launch(fast if verdict else canon, out)
            return
        launch(fast, out)
        ref = torch.empty_like(out)
        launch(canon, ref)
        agrees = bool(torch.equal(out, ref))
        if not agrees:
            log.warning("bcg.invariant: GEMM tile %s differs from the canonical %s for %s; "
                        "the canonical tile runs for this key from now on", fast, canon, key)
            out.copy_(ref)
        with self._lock:
            self._agrees[key] = agrees

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._agrees)


def _capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


VERDICTS = _TileVerdicts()


@triton.jit(do_not_specialize=["M", "BATCH"])
def _gemm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr,
                 M, N, K, BATCH,
                 s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn, s_xb, s_xm, s_xn,
                 alpha, beta,
                 HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_batch = tiles_m * tiles_n
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in range(pid, per_batch * BATCH, NUM_PROGRAMS):
        bid = tile // per_batch
        t = tile % per_batch
        # grouped order (GROUP_M row tiles share a column of B in L2): it picks where a tile
        # runs, never what it sums
        in_group = GROUP_M * tiles_n
        first_m = (t // in_group) * GROUP_M
        size_m = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (t % in_group) % size_m
        pid_n = (t % in_group) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        # 64-bit offsets: Flux's joint GEMMs at batch 16 reach 73,728 x 15,360 elements
        bid64, rm64, rn64 = bid.to(tl.int64), rm.to(tl.int64), rn.to(tl.int64)
        a_base = a_ptr + bid64 * s_ab + rm64[:, None] * s_am
        b_base = b_ptr + bid64 * s_bb + rn64[None, :] * s_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ks in range(0, k_steps):
            kk = ks * BLOCK_K + rk
            a = tl.load(a_base + kk[None, :] * s_ak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(b_base + kk[:, None] * s_bk, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        acc = acc * alpha
        cmask = (rm[:, None] < M) & (rn[None, :] < N)
        if HAS_BIAS:
            x = tl.load(bias_ptr + bid64 * s_xb + rm64[:, None] * s_xm + rn64[None, :] * s_xn, mask=cmask, other=0.0)
            acc = acc + beta * x.to(tl.float32)
        c = c_ptr + bid64 * s_cb + rm64[:, None] * s_cm + rn64[None, :] * s_cn
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=cmask)


@functools.lru_cache(maxsize=None)
def num_programs(device: torch.device) -> int:
    """The persistent grid: one program per SM (a fixed 4 under the CPU interpreter). Cached: a
    device-properties query on every GEMM would be host time on every eager call."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, alpha: float = 1.0,
           beta: float = 1.0, out: Optional[torch.Tensor] = None, tile: Optional[Tile] = None) -> torch.Tensor:
    """alpha * a @ b + beta * bias, batch-invariant in M (and in the batch of a 3-D product).

    a [M, K] or [B, M, K]; b [K, N] or [B, K, N]; bias broadcastable to the output (any strides).
    `tile`: run exactly this tile, unchecked (the probes and tests); by default `tile_for`'s pick,
    checked against the canonical tile on first sight."""
    batched = a.dim() == 3
    a3 = a if batched else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0).expand(a3.shape[0], *b.shape)
    nb, m, k = a3.shape
    n = b3.shape[2]
    assert b3.shape[:2] == (nb, k), f"matmul: {tuple(a.shape)} @ {tuple(b.shape)}"
    if out is None:
        out = torch.empty((nb, m, n), device=a.device, dtype=a.dtype)
    c3 = out if out.dim() == 3 else out.unsqueeze(0)
    if bias is not None:
        x3 = bias.expand(c3.shape) if bias.dim() == 3 else bias.expand(m, n).unsqueeze(0).expand(c3.shape)
    else:
        x3 = c3  # never read
    progs = num_programs(a.device)

    def launch(t: Tile, c: torch.Tensor) -> None:
        _gemm_kernel[(progs,)](
            a3, b3, c, x3, m, n, k, nb,
            a3.stride(0), a3.stride(1), a3.stride(2), b3.stride(0), b3.stride(1), b3.stride(2),
            c.stride(0), c.stride(1), c.stride(2), x3.stride(0), x3.stride(1), x3.stride(2),
            float(alpha), float(beta),
            HAS_BIAS=bias is not None, IEEE=a.dtype == torch.float32, NUM_PROGRAMS=progs,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
            num_warps=t.num_warps, num_stages=t.num_stages)

    if m and n and nb:
        if tile is not None:
            launch(tile, c3)
        else:
            canon = canonical_tile(a.dtype, n, k)
            fast = tile_for(a.dtype, m, n, k, items=nb, sms=progs)
            if fast == canon:
                launch(canon, c3)
            else:
                VERDICTS.run((a.dtype, n, k, fast, bias is not None), fast, canon, launch, c3)
    return out if batched or out.dim() == 2 else out[0]
