"""The fused Triton kernels on the CPU, under Triton's interpreter (TRITON_INTERPRET=1), each equal
to its plan in plain torch, bit for bit (tests/interpreted_kernels.py, one subprocess for all):
adaLN, gated residuals (SANA's and Wan's fp32 plan), SwiGLU, GELU-tanh into a concatenation (both
contractions), LayerNorm + adaLN after its statistics (bf16 plan, Wan's fp32 plan, the norm's own
affine, the gated residual in front), aten's mean order for RMSNorm's variance (row_variance), the
RMSNorm after it (with or without its weight) and its modulation (adaLN, scale), and q/k RoPE (Flux's
and Wan's real pairs, LTX-2's split pairs with a set of frequencies a head in both contractions and
its interleaved pairs over the whole width, GLM-Image's split pairs into the image slice of its
LayerNorm'd joint q / k, MiniMax-H3's split pairs on the leading channels of each RMSNorm'd head, the
complex product, two streams into one joint tensor)
after no norm, after diffusers' RMSNorm (variance given or reduced in the kernel in the mean order)
and after torch's RMSNorm in the fused kernel's modelled order, per head and across heads. A view
two bytes off its buffer is not applicable to the LayerNorm kernel and falls back through the
verifier. fp32 and fp16 (the interpreter's fp16 casts round to nearest even; its bf16 casts do not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def results() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "interpreted_kernels.py")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def _group(results: dict, prefix: str) -> dict:
    found = {k: v for k, v in results.items() if k.startswith(prefix)}
    assert found, f"no check named {prefix}*"
    return found


@pytest.mark.parametrize("prefix", ["adaln", "gated_residual", "swiglu", "gelu_cat"])
def test_elementwise_kernels_equal_their_plans(results, prefix):
    bad = {k: v for k, v in _group(results, prefix).items() if v}
    assert not bad, bad


@pytest.mark.parametrize("prefix", ["ln_adaln", "ln affine", "gated residual f32"])
def test_layer_norm_kernel_after_its_statistics_equals_the_plans(results, prefix):
    bad = {k: v for k, v in _group(results, prefix).items() if v}
    assert not bad, bad


def test_dc_ae_channel_kernels_equal_their_plans(results):
    """bias + SiLU, the squares, RMSNorm over channels (+ residual) and the up-block's bias + shortcut,
    on contiguous and channels-last images."""
    bad = {k: v for k, v in _group(results, "channel ").items() if v}
    assert not bad, bad


def test_linear_attention_in_two_kernels_equals_eager_where_sums_are_exact(results):
    """Layouts, relu, the ones row, the token tail and the division, at three tilings (the bits do not
    depend on the tiling); the summation order is the GPU's."""
    got = _group(results, "linear_fma ")
    assert len(got) == 18 and not any(got.values()), got


def test_rms_variance_in_the_mean_order(results):
    bad = {k: v for k, v in _group(results, "row_variance").items() if v}
    assert not bad, bad


@pytest.mark.parametrize("prefix", ["rms_norm_adaln", "rms_norm_scale"])
def test_rms_norm_kernel_after_its_variance_equals_the_plans(results, prefix):
    bad = {k: v for k, v in _group(results, prefix).items() if v}
    assert not bad, bad


@pytest.mark.parametrize("prefix", ["rope pairs", "rope complex", "rope split", "rope after mean-order",
                                    "rope after fused-order", "rope head rows"])
def test_rope_kernel_equals_its_plans(results, prefix):
    bad = {k: v for k, v in _group(results, prefix).items() if v}
    assert not bad, bad


def test_an_unaligned_view_falls_back(results):
    bad = {k: v for k, v in _group(results, "unaligned").items() if v}
    assert not bad, bad
