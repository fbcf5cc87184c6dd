"""The mode's fast-path verdicts kept across runs on CUDA (bcg/invariant/kept.py): two real processes
over one cache folder. The first decides its call shapes (the canonical kernel runs at each first
sight) and keeps them; the second recalls them, each "agree" after cuBLAS, cuDNN and SDPA reproduce
the kept fingerprint on the seeded probe (so the probe and the vendor kernels must be deterministic
across processes, which is what this test checks on the GPU), and gives the same bytes.

Run on the GPU machine: `python -m pytest tests/gpu/test_invariant_kept_gpu.py -q -s`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

# One process's work under the mode: a linear at SANA-1.6B's width (addmm), a batched matmul (bmm),
# a 3x3 convolution (cuDNN's batched kernel) and a masked attention (the batched SDPA call), at batch 4;
# it writes the outputs and the mode's counts.
SCRIPT = r"""
import json, sys, torch
import torch.nn.functional as F
from bcg.invariant import InvariantConfig, batch_invariant
g = torch.Generator("cuda").manual_seed(1)
x = torch.randn(4 * 300, 2240, generator=g, device="cuda").bfloat16()
w = (torch.randn(2240, 2240, generator=g, device="cuda") * 0.02).bfloat16()
b = torch.randn(2240, generator=g, device="cuda").bfloat16()
a3 = torch.randn(4, 64, 96, generator=g, device="cuda").bfloat16()
b3 = torch.randn(4, 96, 80, generator=g, device="cuda").bfloat16()
img = torch.randn(4, 32, 64, 64, generator=g, device="cuda").bfloat16().to(memory_format=torch.channels_last)
cw = (torch.randn(32, 32, 3, 3, generator=g, device="cuda") * 0.05).bfloat16().to(memory_format=torch.channels_last)
q = torch.randn(4, 20, 1024, 112, generator=g, device="cuda").bfloat16()
k = torch.randn(4, 20, 300, 112, generator=g, device="cuda").bfloat16()
v = torch.randn(4, 20, 300, 112, generator=g, device="cuda").bfloat16()
mask = torch.zeros(4, 1, 1, 300, dtype=torch.bool, device="cuda")
for i, n in enumerate((47, 300, 12, 128)):
    mask[i, ..., :n] = True
with torch.inference_mode(), batch_invariant(InvariantConfig()) as inv:
    outs = [F.linear(x, w, b), torch.bmm(a3, b3), F.conv2d(img, cw, padding=1),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)]
    stats = inv.stats()
torch.save([o.cpu() for o in outs], sys.argv[1])
print(json.dumps(stats["fast_paths"]))
"""


def _run(tmp_path: Path, cache: Path, name: str) -> tuple[dict, list]:
    out = tmp_path / f"{name}.pt"
    env = dict(os.environ, BCGEN_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(out)


def test_a_second_process_recalls_the_verdicts_and_gives_the_same_bytes(tmp_path):
    cache = tmp_path / "cache"
    first, first_out = _run(tmp_path, cache, "first")
    print("first:", first)
    assert all(v["kept"] == 0 for v in first.values())
    decided = sum(v["agree"] + v["differ"] for v in first.values())
    assert decided >= 4  # a GEMM, a bmm, a convolution and an attention shape, at least
    files = list((cache / "invariant").glob("verdicts-*.json"))
    assert len(files) == 1
    again, again_out = _run(tmp_path, cache, "again")
    print("again:", again)
    for path in again:  # every verdict recalled (a fingerprint that did not match would be decided anew)
        assert again[path]["kept"] == again[path]["agree"] + again[path]["differ"] == \
            first[path]["agree"] + first[path]["differ"], (path, first[path], again[path])
        assert again[path]["agree"] == first[path]["agree"]
    for i, (a, b) in enumerate(zip(first_out, again_out)):
        assert torch.equal(a, b), f"output {i} differs between the deciding and the recalling process"


def test_the_triton_checksum_gives_the_torch_paths_integers_on_the_gpu(monkeypatch):
    """The CUDA path (checksum_triton.py) against the torch path on the same device, bit for bit: bf16,
    fp32 and fp16 outputs of assorted lengths, a channels-last VAE-sized one (2^30 lanes, what a DC-AE
    decode at 1024², batch 8 writes), the extreme lane, and several launches (LAUNCH made small)."""
    from bcg.invariant import checksum_triton
    from bcg.invariant.kept import _checksum_torch, _memory_order, checksum

    def lanes(t):
        return _memory_order(t).view(torch.int16)

    g = torch.Generator("cuda").manual_seed(3)
    cases = [torch.randn(n, generator=g, device="cuda").to(dtype) * 1000
             for n in (1, 7, 1024, 16383, 16385, 3 * 16384 + 11) for dtype in (torch.bfloat16, torch.float16,
                                                                                 torch.float32)]
    cases.append(torch.randn(8, 128, 1024, 1024, generator=g, device="cuda", dtype=torch.bfloat16)
                 .to(memory_format=torch.channels_last))
    cases.append(torch.full((70001,), -32768, dtype=torch.int16, device="cuda"))
    for t in cases:
        assert checksum(t) == _checksum_torch(lanes(t)), (t.shape, t.dtype)
    monkeypatch.setattr(checksum_triton, "LAUNCH", 16384 * 4)
    t = torch.randn(5 * 16384 * 4 + 3, generator=g, device="cuda").bfloat16()
    assert len(checksum_triton.lane_sums(lanes(t))) == 6
    assert checksum(t) == _checksum_torch(lanes(t))
