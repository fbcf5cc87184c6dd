"""Run by tests/test_fusions_compile.py in a subprocess: every fused kernel compiled for the H200
(sm_90, Triton's bundled ptxas) on a CPU machine, through the launchers' real calls. A launch is
caught before it needs a GPU: its arguments give the signature and constexprs, and triton.compile
builds PTX and a cubin. This checks what Triton's interpreter does not (constexpr use, types, layouts
the compiler must lower); the bits are the interpreter's and the GPU's tests. Prints one line
RESULTS {kernel + constexprs: null | the compile error}.
"""

from __future__ import annotations

import inspect
import json

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
          torch.int32: "i32"}
RESULTS: dict[str, str | None] = {}


def _compile_only(self, *args, grid, warmup, **kwargs):
    names = list(inspect.signature(self.fn).parameters)
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    options = {k: v for k, v in kwargs.items() if k not in names}
    signature, constexprs = {}, {}
    for name, param in zip(names, self.params):
        if param.is_constexpr:
            constexprs[name] = bound[name] if name in bound else param.default
            signature[name] = "constexpr"
            continue
        v = bound[name]
        if isinstance(v, torch.Tensor):
            signature[name] = "*" + DTYPES[v.dtype]
        elif isinstance(v, bool):
            signature[name] = "i1"
        elif isinstance(v, int):
            signature[name] = "i64" if abs(v) >= 2**31 else "i32"
        else:
            signature[name] = "fp32"
    key = f"{self.fn.__name__} {sorted((k, v) for k, v in constexprs.items())}"
    try:
        triton.compile(ASTSource(self, signature, constexprs), target=TARGET, options=options)
        RESULTS[key] = None
    except Exception as exc:  # noqa: BLE001 - reported per kernel
        RESULTS[key] = f"{type(exc).__name__}: {str(exc)[:1500]}"


JITFunction.run = _compile_only

from bcg.fusions import kernels, kernels_act, kernels_channel, kernels_linear, kernels_norm, kernels_rms  # noqa: E402
from bcg.fusions import kernels_rope as KR  # noqa: E402

for dt in (torch.bfloat16, torch.float32):  # fp16 takes the bf16 paths
    x, s = torch.randn(2, 5, 64).to(dt), torch.randn(2, 1, 64).to(dt)
    w = torch.ones(64, dtype=dt)
    kernels.adaln(x, s, s)
    kernels.gated_residual(x, s, x)
    kernels.gated_residual(x, s.float(), x, f32=True)
    kernels.gated_residual(x, s, x, bias=w)
    for f32, sc in ((False, s), (True, s.float())):
        kernels_norm.ln_adaln(x, 1e-6, sc, sc, f32=f32)
        kernels_norm.ln_adaln(x, 1e-6, sc, sc, residual=x, f32=f32)
        kernels_norm.ln_adaln(x, 1e-6, sc, sc, residual=x, gate=sc, f32=f32)
    kernels_norm.ln_adaln(x, 1e-6, None, None, f32=True, weight=w, bias=w)
    kernels_act.gelu_cat(x, x)
    kernels_act.gelu_cat(None, x, gelu_fma=False)
    kernels_act.swiglu(x, x)
    q = torch.randn(2, 20, 3, 128).to(dt)
    cos = torch.randn(1, 20, 128)
    freqs = torch.polar(torch.ones(1, 20, 64), torch.randn(1, 20, 64))
    wq, wa = torch.ones(128, dtype=dt), torch.ones(384, dtype=dt)
    KR.rope(q, (cos, cos), KR.Rope("pairs"))
    KR.rope(q, (cos.to(dt), cos.to(dt)), KR.Rope("pairs", index=KR.WAN_INDEX))
    for mode in KR.CMUL_MODES:
        KR.rope(q, freqs, KR.Rope("complex", mode))
    KR.rope(q, freqs, KR.Rope("complex"), norm="mean", weight=wq, eps=1e-6)
    KR.rope(q, freqs, KR.Rope("complex"), norm="mean", weight=wq, eps=1e-6, var=torch.ones(2 * 20 * 3))
    KR.rope(q, (cos, cos), KR.Rope("pairs"), torch.empty(2, 40, 3, 128, dtype=dt), 20, norm="fused", weight=wq,
            eps=1e-6)
    for explicit in (False, True):
        KR.EXPLICIT_TREE = explicit
        KR.rope(q, (cos, cos), KR.Rope("pairs", index=KR.WAN_INDEX), norm="fused", weight=wa, eps=1e-6,
                across_heads=True, sq_fma=explicit)
    KR.EXPLICIT_TREE = False
    for L in (3840, 128):
        kernels_rms.row_variance(torch.randn(32, L).to(dt), "vec_dec")
    kernels_rms.row_variance(torch.randn(32, 128).to(dt), "strided_inc")
    v = torch.ones(2, 5, 1)
    kernels_rms.rms_scale(x, v, w, 1e-6, s)
    kernels_rms.rms_residual(x, s, x, v, w, 1e-6)
    # LTX-2's: RMSNorm without a weight + adaLN (and bare); split RoPE with a set of frequencies a head
    # (a [B, S, H, D/2] view of its [B, H, S, D/2]), interleaved over the whole row with a batch of freqs
    kernels_rms.rms_adaln(x, v, None, 1e-6, s, s)
    kernels_rms.rms_adaln(x, v, w, 1e-6, None, None)
    cs = torch.randn(2, 3, 20, 64).transpose(1, 2)
    for mode in ("plain", "fma_bd_ad"):
        KR.rope(q, (cs, cs), KR.Rope("split", mode))
        KR.rope(q, (cs, cs), KR.Rope("split", mode), norm="fused", weight=wa, eps=1e-6, across_heads=True)
    cw = torch.randn(2, 20, 384)
    KR.rope(q.reshape(2, 20, 1, 384), (cw, cw), KR.Rope("pairs"))
    KR.rope(q.reshape(2, 20, 1, 384), (cw, cw), KR.Rope("pairs"), norm="fused", weight=wa, eps=1e-6)
    # SANA's
    cl = torch.randn(2, 32, 4, 4).to(dt).contiguous(memory_format=torch.channels_last)
    kernels.bias_silu_(cl, torch.ones(32, dtype=dt))
    kernels.bias_glu(cl, torch.ones(32, dtype=dt))
    kernels.linear_attention_div(torch.randn(2, 2, 9, 16), dt, 1e-15)
    kernels.linear_attention_prep(x, x, x, 4)
    kernels.dwconv_glu(cl, torch.ones(32, 1, 3, 3, dtype=dt), torch.ones(32, dtype=dt), False)
    kernels.dwconv_glu_rows(cl, torch.ones(32, 1, 3, 3, dtype=dt), torch.ones(32, dtype=dt))
    if dt == torch.bfloat16:
        kernels.silu_dwconv_glu(cl, torch.ones(32, dtype=dt), torch.ones(32, 1, 3, 3, dtype=dt), torch.ones(32, dtype=dt))
    xq = torch.randn(2, 6, 64).to(dt)
    kernels_linear.linear_attention_fma(xq, xq, xq, 2, 1e-15)
    # SANA's DC-AE decoder's (both dense layouts)
    for img in (cl, cl.contiguous()):
        v4 = torch.ones(2, 4, 4, 1)
        kernels_channel.channel_rms(img, v4, torch.ones(32, dtype=dt), torch.ones(32, dtype=dt), 1e-5, img)
        kernels_channel.channel_rms(img, v4, torch.ones(32, dtype=dt), torch.ones(32, dtype=dt), 1e-5, relu=True)
        kernels_channel.up_shortcut_add_(torch.empty_like(img), torch.ones(32, dtype=dt), img[:, :16, :2, :2], 8)
        kernels_channel.nearest2x(img)
KR.cmul(freqs, freqs, "fma_ac_ad")
kernels_rms.rsqrt(torch.ones(8))
print("RESULTS " + json.dumps(RESULTS))
