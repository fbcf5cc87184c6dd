"""bcg.invariant.kept: the fast paths' verdicts outlive the run that made them, a kept "agree" only once
the vendor kernel reproduces the fingerprint kept with it. CPU kernels stand in for cuBLAS and the
Triton GEMM (the mechanism is device-blind); each "run" is a fresh Verdicts over the same file, as a
fresh process would be. tests/gpu/test_invariant_kept_gpu.py runs two real processes on CUDA."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from bcg.invariant import InvariantConfig, kept
from bcg.invariant.kept import KeptVerdicts, checksum
from bcg.invariant.verified import Verdicts, layout, probe_operands
from bcg.verdict_file import VerdictFile
from tests.stand_in_gemms import canonical as _canonical
from tests.stand_in_gemms import same_sums as _same_sums
from tests.stand_in_gemms import split_k as _split_k


class Counted:
    """A kernel that counts its calls (so a test can say the canonical kernel never ran)."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def _operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 96, generator=g), torch.randn(96, 48, generator=g)


def _run(path, canonical, fast, operands, name="test"):
    """One run's first call of the key: a fresh Verdicts over the file at `path`."""
    v = Verdicts(name)
    v.keep_in(KeptVerdicts(VerdictFile(path)))
    key = ("mm", layout(operands[0]), layout(operands[1]))
    ran, out = v.run(key, canonical, fast, operands)
    return v, ran, out


def test_a_kept_agreement_runs_the_vendor_kernel_without_the_canonical_one(tmp_path):
    a, b = _operands()
    path = tmp_path / "v.json"
    first, ran, _ = _run(path, _canonical, _same_sums, (a, b))
    assert not ran and first.counts() == {"agree": 1, "differ": 0, "kept": 0}
    canonical, fast = Counted(_canonical), Counted(_same_sums)
    again, ran, out = _run(path, canonical, fast, _operands(seed=1))  # the next run, other values
    assert ran and torch.equal(out, _canonical(*_operands(seed=1)))
    assert canonical.calls == 0 and fast.calls == 2  # the fingerprint, then the call
    assert again.counts() == {"agree": 1, "differ": 0, "kept": 1}


def test_a_vendor_kernel_that_no_longer_gives_the_fingerprint_is_decided_again(tmp_path, caplog):
    # a cuBLAS swapped under the same version strings: the kept "agree" must not let its bytes through
    a, b = _operands()
    path = tmp_path / "v.json"
    _run(path, _canonical, _same_sums, (a, b))
    assert not torch.equal(_split_k(a, b), _canonical(a, b))  # else this proves nothing
    with caplog.at_level(logging.WARNING, logger="bcg.invariant.verified"):
        again, ran, out = _run(path, _canonical, _split_k, (a, b))
    assert not ran and torch.equal(out, _canonical(a, b))
    assert again.counts() == {"agree": 0, "differ": 1, "kept": 0}
    assert "no longer gives the kept fingerprint" in caplog.text
    assert KeptVerdicts(VerdictFile(path)).recall("test", ("mm", layout(a), layout(b)))["ok"] is False


def test_a_kept_difference_runs_the_canonical_kernel_without_a_look(tmp_path):
    a, b = _operands()
    path = tmp_path / "v.json"
    _run(path, _canonical, _split_k, (a, b))
    fast = Counted(_split_k)
    again, ran, out = _run(path, _canonical, fast, (a, b))
    assert not ran and torch.equal(out, _canonical(a, b)) and fast.calls == 0
    assert again.counts() == {"agree": 0, "differ": 1, "kept": 1}


def test_an_edited_fingerprint_is_not_trusted_and_is_made_anew(tmp_path):
    a, b = _operands()
    path = tmp_path / "v.json"
    _run(path, _canonical, _same_sums, (a, b))
    data = json.loads(path.read_text())
    (entry,) = data["verdicts"].values()
    right = list(entry["fingerprint"])
    entry["fingerprint"][0] += 1
    path.write_text(json.dumps(data))
    canonical = Counted(_canonical)
    again, ran, _ = _run(path, canonical, _same_sums, (a, b))
    assert not ran and canonical.calls == 2  # decided again: the call and the probe
    assert again.counts() == {"agree": 1, "differ": 0, "kept": 0}
    (entry,) = json.loads(path.read_text())["verdicts"].values()
    assert entry["fingerprint"] == right


def test_verdicts_of_one_name_do_not_answer_for_another(tmp_path):
    a, b = _operands()
    path = tmp_path / "v.json"
    _run(path, _canonical, _same_sums, (a, b), name="cuBLAS's GEMM")
    other, _, _ = _run(path, _canonical, _same_sums, (a, b), name="cuDNN's batched convolution")
    assert other.counts()["kept"] == 0


def test_a_torn_file_is_ignored_and_replaced(tmp_path, caplog):
    a, b = _operands()
    path = tmp_path / "v.json"
    path.write_text('{"verdicts": {"ab')
    with caplog.at_level(logging.WARNING):
        v, ran, out = _run(path, _canonical, _same_sums, (a, b))
    assert not ran and torch.equal(out, _canonical(a, b)) and "ignoring the verdict cache" in caplog.text
    assert v.counts() == {"agree": 1, "differ": 0, "kept": 0}
    assert len(json.loads(path.read_text())["verdicts"]) == 1


def test_the_probe_is_the_same_in_every_run_and_a_mask_is_all_true():
    q = torch.randn(4, 2, 8, 16).transpose(1, 2)
    mask = torch.rand(4, 1, 8, 5) > 0.5
    idx = torch.arange(6)
    first, again = probe_operands([q, mask, None, idx]), probe_operands([q, mask, None, idx])
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], q)
    assert layout(first[0]) == layout(q) and layout(first[1]) == layout(mask)
    assert first[1].all() and first[2] is None and first[3] is idx


def test_the_probe_leaves_the_global_generator_alone():
    x = torch.randn(5, 5)
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    probe_operands([x])
    assert torch.equal(torch.rand(3), want)


def test_the_checksum_sees_one_changed_bit_and_not_the_chunking(monkeypatch):
    x = torch.randn(1000, 37, dtype=torch.float32)
    base = checksum(x)
    assert checksum(x.clone()) == base
    y = x.clone()
    y.view(torch.int32)[123, 7] ^= 1  # one bit of one element
    assert checksum(y) != base
    monkeypatch.setattr(kept, "CHUNK", 1000)  # many chunks, a short last one
    assert checksum(x) == base


def test_the_checksum_is_the_three_exact_sums_of_the_int16_lanes(monkeypatch):
    """The integers kept fingerprints hold (kept.py's files outlive a change to how they are summed): the
    plain, ramp-weighted and squared sums of the bytes as int16 lanes, computed here in numpy at once."""
    import numpy as np

    x = torch.randn(3001, 7, dtype=torch.bfloat16) * 1000
    lanes = x.view(torch.int16).reshape(-1).numpy().astype(np.int64)
    ramp = np.arange(lanes.size, dtype=np.int64) % 251 + 1
    want = [int(lanes.sum()), int((lanes * ramp).sum()), int((lanes * lanes).sum()), lanes.size]
    assert checksum(x) == want
    monkeypatch.setattr(kept, "CHUNK", 4096)  # six chunks, a short last one: the same integers
    assert checksum(x) == want
    odd = torch.arange(9, dtype=torch.uint8)  # one-byte elements are read as uint8 lanes
    assert checksum(odd) == [36, sum(v * (v % 251 + 1) for v in range(9)), sum(v * v for v in range(9)), 9]


# The Triton pass (checksum_triton.py, the CUDA path) on the CPU under Triton's interpreter, against the
# torch path and numpy: random lanes of lengths around the kernel's block and program spans, the extreme
# lane (-2^15, whose square is 2^30), and several launches (LAUNCH made small), whose ramp must follow a
# lane's place in the whole tensor. tests/gpu/test_invariant_kept_gpu.py compares the two on a GPU.
_INTERPRETED = r"""
import json
import numpy as np
import torch
from bcg.invariant import checksum_triton
from bcg.invariant.kept import _checksum_torch, _checksum_triton

def numpy_sums(x):
    lanes = x.numpy().astype(np.int64)
    ramp = np.arange(lanes.size, dtype=np.int64) % 251 + 1
    return [int(lanes.sum()), int((lanes * ramp).sum()), int((lanes * lanes).sum()), lanes.size]

g = torch.Generator().manual_seed(0)
cases = {n: torch.randint(-32768, 32768, (n,), generator=g, dtype=torch.int32).to(torch.int16)
         for n in (1, 5, 1023, 1024, 16384, 16385, 40001)}
cases["min"] = torch.full((20000,), -32768, dtype=torch.int16)
bad = [str(k) for k, x in cases.items() if not (_checksum_triton(x) == _checksum_torch(x) == numpy_sums(x))]
checksum_triton.LAUNCH = 2 * 16384
x = torch.randint(-32768, 32768, (100003,), generator=g, dtype=torch.int32).to(torch.int16)
launches = len(checksum_triton.lane_sums(x))
if not _checksum_triton(x) == _checksum_torch(x) == numpy_sums(x):
    bad.append("launches")
print(json.dumps({"bad": bad, "launches": launches}))
"""


def test_the_triton_checksum_gives_the_torch_paths_integers_interpreted():
    from tests.helpers import run_interpreted

    pytest.importorskip("triton")
    out = run_interpreted(_INTERPRETED, timeout=300)
    assert json.loads(out.strip().splitlines()[-1]) == {"bad": [], "launches": 4}


def test_the_checksum_reads_a_dense_tensor_in_memory_order_without_a_copy():
    x = torch.randn(8, 6, 5, 4, dtype=torch.bfloat16)
    last = x.to(memory_format=torch.channels_last)
    assert checksum(x.permute(3, 2, 1, 0)) == checksum(x)  # the same memory, read as it lies
    assert checksum(last) == checksum(last.permute(0, 2, 3, 1).contiguous())
    sliced = x[:, 1:4]  # not dense: read through a contiguous copy
    assert checksum(sliced) == checksum(sliced.contiguous())
    assert checksum(x[:0]) == [0, 0, 0, 0]


def test_the_file_follows_the_environment_and_the_mode(monkeypatch):
    base = KeptVerdicts.default(InvariantConfig())
    assert base is not None and base.file.path.parent.name == "invariant"
    assert KeptVerdicts.default(InvariantConfig()).file.path == base.file.path
    assert KeptVerdicts.default(InvariantConfig(fast_paths=False)).file.path == base.file.path
    assert KeptVerdicts.default(InvariantConfig(attention="efficient")).file.path != base.file.path
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert KeptVerdicts.default(InvariantConfig()).file.path != base.file.path
    monkeypatch.setenv(kept.ENV_SWITCH, "off")
    assert KeptVerdicts.default(InvariantConfig()) is None


@pytest.mark.parametrize("value", ["0", "off", "False", " no "])
def test_the_switch_reads_the_usual_spellings_of_off(monkeypatch, value):
    monkeypatch.setenv(kept.ENV_SWITCH, value)
    assert KeptVerdicts.default(InvariantConfig()) is None


def test_verdicts_put_from_many_threads_all_reach_the_file(tmp_path):
    # the job's encode, denoise and decode threads each meet call shapes of their own
    import threading

    file = VerdictFile(tmp_path / "v.json")
    threads = [threading.Thread(target=file.put, args=(("k", i), i % 2 == 0, f"key {i}")) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    again = VerdictFile(tmp_path / "v.json")
    assert [again.get(("k", i)) for i in range(16)] == [i % 2 == 0 for i in range(16)]
