"""SANA's DC-AE decoder with its fused blocks (bcg/fusions/dc_ae.py) on the GPU: the decode equals
eager's byte for byte, on the first call (every chain and block verified against eager) and after it
(the fused kernels serving), for the released dc-ae-f32c32-sana-1.0 config with random bf16 weights
and for the tiny preset's VAE; every chain the rules use is verified, none rejected.

Run on the GPU machine: `python -m pytest tests/gpu/test_fusions_dc_ae_gpu.py -q -s`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from bcg.fusions import install_fusions
from bcg.fusions.cache import VerdictCache

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.gpu


def _vae(config: dict, dtype):
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    vae = AutoencoderDC(**config).to("cuda", dtype).eval()
    g = torch.Generator("cuda").manual_seed(0)
    with torch.no_grad():  # normal_(0, 0.02) as the real-size benchmarks build it; norms' weights and biases too
        for name, p in vae.named_parameters():
            scale = 0.02 if p.dim() >= 2 else 0.3
            base = 1.0 if name.endswith("weight") and p.dim() == 1 else 0.0
            p.copy_((base + scale * torch.randn(p.shape, generator=g, device="cuda")).to(dtype))
    return vae


def _configs():
    from bench_job_realsize import DC_AE_F32C32_SANA

    from tests.helpers import compose_cfg

    tiny = dict(compose_cfg(["output_dir=/tmp/x"]).model.tiny.vae)
    return {"dc-ae-f32c32-sana-1.0 512px": (DC_AE_F32C32_SANA, 512, 2), "sana_tiny": (tiny, 128, 3)}


@pytest.mark.parametrize("name", ["dc-ae-f32c32-sana-1.0 512px", "sana_tiny"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_decode_equals_eager(name, dtype, tmp_path):
    config, res, batch = _configs()[name]
    vae = _vae(config, dtype)
    scale = 2 ** (len(config["decoder_block_out_channels"]) - 1)
    z = torch.randn(batch, config["latent_channels"], res // scale, res // scale,
                    generator=torch.Generator("cuda").manual_seed(1), device="cuda").to(dtype)
    with torch.no_grad():
        want = vae.decode(z, return_dict=False)[0]
        fx = install_fusions(vae, backend="triton")
        fx.verifier.cache = VerdictCache(tmp_path / "verdicts.json")  # this test's own verdicts, not the user's
        first = vae.decode(z, return_dict=False)[0]
        again = vae.decode(z, return_dict=False)[0]
    c = fx.counters
    print(f"\n[dc-ae {name} {dtype}] {fx.stats()}")
    assert torch.equal(first, want) and torch.equal(again, want)
    assert {rule for rule, _, _ in fx.installed} == {"dc_ae_decoder", "dc_ae_resblock", "dc_ae_up_block",
                                                  "dc_ae_efficientvit"}
    in_decoder = {id(m) for m in vae.decoder.modules()}  # the decoder itself among them
    decoder_blocks = sum(1 for _, m, _ in fx.installed if id(m) in in_decoder)  # the encoder's never run here
    assert c.forwards_rejected == 0 and c.forwards_verified == decoder_blocks > 0, c.rejections
    ops = " ".join(c.rejections)
    assert not any(o in ops for o in ("channel_rms", "up_nearest", "up_shortcut", "conv_bias_silu", "conv_bias_glu")), c.rejections
    assert c.fused_calls > 0
