"""Under `bcg.invariant` the DC-AE's fused decode reduces RMSNorm's variance in the mode's own order, in
one pass, and gives the mode's bytes (on the CPU, under Triton's interpreter; the mode's CUDA kernels
registered for the CPU key, as tests/test_batch_invariance_triton.py does).

Session 46's summaries counted 2,128 "eager calls" in the mode's decode: the variance chain
(`ops_rms.RMS_VARIANCE`) passing every call past its candidates in aten's orders, which the mode's eager
(its row kernel, `reduce_triton.row_sum`) does not match, to `sq_mean`: Triton's fp32 squares written out,
then the mode's mean over them. The `rows` candidate is that row kernel squaring as it loads (one kernel
source, the same order by construction): it must agree wherever the mode's mean ran, and sq_mean then
never runs. The interpreter proves the structure (which rows, which order, where the roundings are); the
H200's own bits are tests/gpu/test_batch_invariance_gpu.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton")

_SCRIPT = textwrap.dedent("""
    import json
    from tests.interpreter_libdevice import swap
    swap()
    import torch
    from diffusers import AutoencoderDC
    from bcg.fusions import install_fusions, kernels_rms
    from bcg.fusions.ops_rms import RMS_VARIANCE
    from bcg.invariant import InvariantConfig, cuda_ops
    from bcg.invariant.mode import BatchInvariance
    from bcg.invariant.reduce_triton import row_sum
    from tests.gpu.test_batch_invariance_gpu import _DC_AE_SMALL

    kernels_rms.RSTD_IN_KERNEL = False  # as tests/interpreted_kernels.py: aten's rsqrt, read by the kernel
    out = {"square": [], "variance": {}}
    g = torch.Generator().manual_seed(0)
    square = next(op for op in RMS_VARIANCE if op.name == "rms_variance_rows")
    for dt in (torch.float32, torch.float16):
        for n in (64, 200, 1500):  # 1500: two of the kernel's 1,024-lane steps, the second masked
            x = (torch.randn(7, n, generator=g) * 3).to(dt)
            if not torch.equal(square.fused(x), row_sum(x.float().pow(2), True, True, torch.float32)):
                out["square"].append(f"{dt} {n}")

    torch.manual_seed(0)
    vae = AutoencoderDC(**_DC_AE_SMALL).eval()
    z = torch.randn(2, 32, 4, 4, generator=g)
    mode = BatchInvariance(InvariantConfig(cuda="off"))
    lib = torch.library.Library("aten", "IMPL")
    cuda_ops.register(lib, mode, key="CPU")
    with torch.no_grad():
        want = vae.decode(z, return_dict=False)[0]  # the mode's eager decode
        fx = install_fusions(vae, backend="triton")
        first = vae.decode(z, return_dict=False)[0]  # first sight: every chain verified against the mode's eager
        again = vae.decode(z, return_dict=False)[0]  # the verdicts: fused where they agreed
        fx.remove()
    lib._destroy()
    for key, ok in fx.verifier.state.items():
        if isinstance(key[0], str) and key[0].startswith("rms_variance_"):
            out["variance"].setdefault(key[0], []).append(ok)
    c = fx.counters
    out.update(first=torch.equal(first, want), again=torch.equal(again, want), fused=c.fused_calls,
               handed_on=c.handed_on, mean=mode.calls["cuda.mean"], mean_fallback=mode.calls["cuda.mean.fallback"])
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def result() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", BCGEN_FUSION_CACHE="off",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])


def test_the_square_pass_sums_as_the_modes_mean_of_the_squares(result):
    assert result["square"] == [], result["square"]


def test_the_decoders_variance_takes_the_modes_order_in_one_pass(result):
    variance = result["variance"]
    assert result["mean"] > 0 and result["mean_fallback"] == 0, result  # eager's means were the mode's kernel
    assert variance["rms_variance_rows"] and all(variance["rms_variance_rows"]), variance
    assert "rms_variance_sq_mean" not in variance, variance  # never reached: the rows candidate agreed first
    assert result["handed_on"] > 0, result  # past aten's orders, counted apart from eager runs


def test_the_fused_decode_gives_the_modes_bytes(result):
    assert result["first"] and result["again"], result
    assert result["fused"] > 0, result
