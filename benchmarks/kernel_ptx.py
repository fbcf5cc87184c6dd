"""What a Triton kernel compiles to for the H200, on a machine without a GPU: registers, spills and the
width of its global loads and stores, per launch (issue 28: a kernel below bandwidth, seen before any
device time is spent).

Each launch made inside `capture()` is compiled for sm_90 (Triton's bundled ptxas) through the JIT's
own binder, so with the specialisation the GPU's launch would get (pointers and integers divisible by
16 marked so, integers equal to 1 made constants). Without it the PTX is not what the GPU runs (every
load scalar). Nothing is launched.

    python benchmarks/kernel_ptx.py            # SANA-1.6B's fused block kernels at 1024², batch 8

Prints one line a launch: kernel, constexprs, warps, registers, spill bytes, and the count of each
`ld.global` / `st.global` form (`.v4.b32` is 16 bytes a thread; `.b16` one bf16 element).
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
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(ptx)
        r = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True, check=True)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    memory = collections.Counter(re.findall(r"(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx))
    names = [p.name for p in jit.params]
    small = {names[k[0]]: v for k, v in sorted(constexprs.items()) if isinstance(v, (int, bool)) and len(k) == 1}
    return {"kernel": jit.fn.__name__, "constexprs": small, "warps": options.num_warps,
            "registers": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else 0,
            "memory": dict(memory)}


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
