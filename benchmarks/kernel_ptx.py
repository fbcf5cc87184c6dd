"""What a Triton kernel compiles to for the H200, on a machine without a GPU: registers, spills and the
width of its global loads and stores, per launch (issue 28: a kernel below bandwidth, seen before any
device time is spent).

Each launch made inside `capture()` is compiled for sm_90 (Triton's bundled ptxas) through the JIT's
own binder, so with the specialisation the GPU's launch would get (pointers and integers divisible by
16 marked so, integers equal to 1 made constants). Without it the PTX is not what the GPU runs (every
load scalar). Nothing is launched.

    python benchmarks/kernel_ptx.py            # SANA-1.6B's fused block kernels at 1024², batch 8

Prints one line a launch: kernel, constexprs, warps, registers, spill bytes, shared memory, the warps
an SM can hold at those (occupancy: registers bound SANA's depthwise walk at 12 of 64, which Nsight
Compute read as its limit, benchmarks/results/ncu_dw_rows_h100_s58.txt), the count of each
`ld.global` / `st.global` form (`.v4.b32` is 16 bytes a thread; `.b16` one bf16 element), and the
instructions of each loop of the machine code (cuobjdump's SASS: a backward branch and its target),
what one trip issues a warp (session 58's FMA taps took the walk's from 370 to 291).
"""

from __future__ import annotations

import collections
import contextlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def report(jit, args, kwargs) -> dict:
    """Compile one launch for sm_90 and read its PTX and ptxas's resource line."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    # the JIT's own binder and packing for the H200's target: its specialisation (pointers and ints
    # divisible by 16, ints equal to 1 made constants) is what the GPU's launch would compile.
    # `_pack_args` is Triton 3.9's (private): tests/test_kernel_ptx.py fails if it moves
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(jit, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    ptx = compiled.asm["ptx"]
    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True, check=True)
        sass = subprocess.run([str(Path(ptxas).with_name("cuobjdump")), "-sass", f"{d}/k.cubin"],
                              capture_output=True, text=True, check=True).stdout
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    memory = collections.Counter(re.findall(r"(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx))
    names = [p.name for p in jit.params]
    small = {names[k[0]]: v for k, v in sorted(constexprs.items()) if isinstance(v, (int, bool)) and len(k) == 1}
    registers = int(regs.group(1)) if regs else None
    shared = int(compiled.metadata.shared)
    return {"kernel": jit.fn.__name__, "constexprs": small, "warps": options.num_warps,
            "registers": registers, "spill_bytes": int(spill.group(1)) if spill else 0, "shared_bytes": shared,
            "warps_per_sm": warps_per_sm(registers, options.num_warps, shared) if registers else None,
            "memory": dict(memory), "loop_instructions": loop_sizes(sass)}


# sm_90's per-SM limits (CUDA's occupancy calculator): 64K registers, given out 256 to a warp at a time
# (so a thread's count rounds up to 8), 64 warps, 32 blocks, 228 KB of shared memory of which a block takes
# its own plus 1 KB the runtime reserves
SM_REGISTERS, SM_WARPS, SM_BLOCKS, SM_SHARED, BLOCK_RESERVED = 65536, 64, 32, 233472, 1024


def warps_per_sm(registers: int, warps: int, shared: int) -> int:
    """The warps of this launch an SM can hold at once: its blocks as registers, shared memory and the
    warp and block limits allow, times its warps a block."""
    per_warp = -(-registers // 8) * 8 * 32
    blocks = min(SM_REGISTERS // (per_warp * warps), SM_SHARED // (shared + BLOCK_RESERVED), SM_BLOCKS,
                 SM_WARPS // warps)
    return blocks * warps


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def loop_sizes(sass: str) -> list:
    """The instruction count of each loop in cuobjdump's SASS (a branch back to a lower address, from
    its target to the branch itself), in the order the loops end: the instructions a warp issues for one
    trip, predicated-off ones included."""
    lines = [(int(a, 16), text) for a, text in _SASS_LINE.findall(sass)]
    sizes = []
    for addr, text in lines:
        back = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if back and int(back.group(1), 16) < addr:
            start = int(back.group(1), 16)
            sizes.append(sum(1 for a, _ in lines if start <= a <= addr))
    return sizes


@contextlib.contextmanager
def capture() -> Iterator[list]:
    """Inside: every Triton launch is compiled and reported instead of run (the list fills)."""
    from triton.runtime.jit import JITFunction

    rows: list = []
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        rows.append(report(self, args, kwargs))

    JITFunction.run = compile_only
    try:
        yield rows
    finally:
        JITFunction.run = run


def sana_block_launches() -> None:
    """SANA-1.6B's fused block kernels at 1024², batch 8 (16 rows of 32 x 32 tokens, D = 2240, the
    GLUMBConv's 2 x 5600 channels), on empty CPU tensors of the job's layouts."""
    from bcg.fusions import kernels, kernels_linear, kernels_norm

    dt, rows, side, D, hidden = torch.bfloat16, 16, 32, 2240, 5600
    x = torch.empty(rows, side * side, D, dtype=dt)
    mod = torch.empty(rows, 1, D, dtype=dt)
    kernels_norm.ln_adaln(x, 1e-6, mod, mod)
    kernels_norm.ln_adaln(x, 1e-6, mod, mod, residual=x)
    kernels_norm.ln_adaln(x, 1e-6, mod, mod, residual=x, gate=mod)
    kernels.gated_residual(x, mod, x)
    act = torch.empty(rows, 2 * hidden, side, side, dtype=dt).contiguous(memory_format=torch.channels_last)
    bias, w_dw = torch.empty(2 * hidden, dtype=dt), torch.empty(2 * hidden, 1, 3, 3, dtype=dt)
    kernels.bias_silu_(act, bias)
    kernels.bias_glu(act, bias)
    kernels.dwconv_glu(act, w_dw, bias, False)
    kernels.dwconv_glu_rows(act, w_dw, bias)
    kernels_linear.linear_attention_fma(x, x, x, D // 32, 1e-15)


def main() -> None:
    with capture() as rows:
        sana_block_launches()
    for r in rows:
        print(r, flush=True)


if __name__ == "__main__":
    main()
