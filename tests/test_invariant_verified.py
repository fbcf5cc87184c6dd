"""bcg.invariant.verified: a vendor kernel runs for a call shape only where it gave the canonical
kernel's bits, on the call's operands and on random ones of the same layout; the canonical bytes
come back either way. CPU kernels stand in for cuBLAS and the Triton GEMM: the mechanism is the same."""

from __future__ import annotations

import torch

from bcg.invariant.verified import Verdicts, layout, math_settings, random_like
from tests.stand_in_gemms import canonical as _canonical
from tests.stand_in_gemms import same_sums as _same_sums
from tests.stand_in_gemms import split_k as _split_k


def _operands(m=64, k=96, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def test_an_agreeing_kernel_runs_from_the_second_call_on():
    v = Verdicts("test")
    a, b = _operands()
    ran, out = v.run(("mm", layout(a), layout(b)), _canonical, _same_sums, (a, b))
    assert not ran and torch.equal(out, _canonical(a, b))  # the first call decides, and returns the canonical
    ran, out = v.run(("mm", layout(a), layout(b)), _canonical, _same_sums, (a, b))
    assert ran and torch.equal(out, _canonical(a, b))
    assert v.counts() == {"agree": 1, "differ": 0, "kept": 0}


def test_a_kernel_with_other_sums_never_runs_and_the_canonical_bytes_come_back():
    v = Verdicts("test")
    a, b = _operands()
    assert not torch.equal(_split_k(a, b), _canonical(a, b))  # else this test proves nothing
    for _ in range(3):
        ran, out = v.run(("mm", layout(a), layout(b)), _canonical, _split_k, (a, b))
        assert not ran and torch.equal(out, _canonical(a, b))
    assert v.counts() == {"agree": 0, "differ": 1, "kept": 0}


def test_operands_that_agree_by_accident_do_not_decide_the_key():
    # zero weights (or padding rows) give 0 under any order of the sums: the random probe of the
    # same layout is what refuses the kernel
    v = Verdicts("test")
    a, b = torch.zeros(64, 96), torch.zeros(96, 48)
    assert torch.equal(_split_k(a, b), _canonical(a, b))
    ran, _ = v.run(("mm", layout(a), layout(b)), _canonical, _split_k, (a, b))
    assert not ran and v.counts() == {"agree": 0, "differ": 1, "kept": 0}


def test_the_verdict_is_per_layout():
    v = Verdicts("test")
    a, b = _operands()
    bt = b.t().contiguous().t()  # the same values, other strides: another kernel may run
    v.run(("mm", layout(a), layout(b)), _canonical, _same_sums, (a, b))
    ran, _ = v.run(("mm", layout(a), layout(bt)), _canonical, _same_sums, (a, bt))
    assert not ran and v.counts() == {"agree": 2, "differ": 0, "kept": 0}


def test_random_like_keeps_shape_strides_and_alignment():
    base = torch.randn(40, 33).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    for t in (base, base.t(), base[:, 1:], base[3:, 5:20].t(), torch.randn(7).expand(5, 7), base[:0]):
        r = random_like(t, gen)
        assert layout(r) == layout(t), (layout(r), layout(t))
        if t.numel() and t.stride(0):
            assert not torch.equal(r, t)
    assert random_like(None, gen) is None


def test_the_probe_leaves_the_global_generator_alone():
    # a sample's noise comes from its own seed: verifying a kernel must not move torch's global RNG
    v = Verdicts("test")
    a, b = _operands()
    torch.manual_seed(123)
    want = torch.rand(4)
    torch.manual_seed(123)
    v.run(("mm", layout(a), layout(b)), _canonical, _same_sums, (a, b))
    assert torch.equal(torch.rand(4), want)


def test_the_math_settings_are_part_of_a_key():
    # reduced-precision reductions or TF32 let the vendor kernel sum another way for the same shape
    m = torch.backends.cuda.matmul
    before, flag = math_settings(), m.allow_bf16_reduced_precision_reduction
    try:
        m.allow_bf16_reduced_precision_reduction = not flag
        assert math_settings() != before
    finally:
        m.allow_bf16_reduced_precision_reduction = flag
    assert math_settings() == before
