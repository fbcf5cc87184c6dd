"""SANA's DC-AE decoder rules (bcg/fusions/dc_ae.py) on the CPU: each chain's rounding plan equals
eager bit for bit (RMSNorm over the channels + residual on both image layouts and three dtypes; the
up-block's conv + bias + shortcut in cuDNN's order), and the rules, installed on a real
`AutoencoderDC`, leave its decode's bytes as they were. The Triton kernels against these plans:
tests/test_fusions_interpreted.py; against cuDNN and aten on the H200: tests/gpu/test_fusions_dc_ae_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bcg.fusions import dc_ae, install_fusions
from bcg.fusions.applicable import NotApplicable
from bcg.fusions.cache import VerdictCache
from bcg.fusions.ops_channel import CHANNEL_RMS, UP_NEAREST, UP_SHORTCUT
from tests.helpers import compose_cfg

LAYOUTS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def _norm(C: int, dtype) -> nn.Module:
    from diffusers.models.normalization import RMSNorm

    norm = RMSNorm(C, eps=1e-5, elementwise_affine=True, bias=True)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(C))
        norm.bias.copy_(0.3 * torch.randn(C))
    return norm.to(dtype)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("residual,relu", [(True, False), (False, False), (False, True)])
def test_channel_rms_plan_equals_eager(layout, dtype, residual, relu):
    torch.manual_seed(0)
    B, C, H, W = 2, 32, 5, 7
    h = (3 * torch.randn(B, C, H, W)).to(dtype).contiguous(memory_format=LAYOUTS[layout])
    x = torch.randn(B, C, H, W).to(dtype).contiguous(memory_format=LAYOUTS[layout]) if residual else None
    norm = _norm(C, dtype)
    var = h.movedim(1, -1).float().pow(2).mean(-1, keepdim=True)  # what the variance chain hands over
    with torch.no_grad():
        want = CHANNEL_RMS.eager(h, var, norm, norm.eps, x, relu)
        got = CHANNEL_RMS.reference(h, var, norm, norm.eps, x, relu)
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype


def test_channel_rms_refuses_a_norm_of_another_dtype():
    h = torch.randn(1, 8, 2, 2).to(torch.bfloat16)
    var = h.movedim(1, -1).float().pow(2).mean(-1, keepdim=True)
    with pytest.raises(NotApplicable, match="dtype"):
        CHANNEL_RMS.reference(h, var, _norm(8, torch.float32), 1e-5, None)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cin,cout", [(64, 32), (32, 32)])  # repeats 2 and 4, as DC-AE's up blocks
def test_up_shortcut_plan_equals_the_cudnn_order_chain(layout, dtype, cin, cout):
    """cuDNN runs the conv without its bias and adds the bias in a kernel of its own (aten's
    _convolution); the CPU's oneDNN adds it inside the conv, so the chain is built in cuDNN's order."""
    torch.manual_seed(1)
    conv = nn.Conv2d(cin, cout, 3, 1, 1).to(dtype)
    x = torch.randn(2, cin, 3, 4).to(dtype).contiguous(memory_format=LAYOUTS[layout])
    up = F.interpolate(x, scale_factor=2, mode="nearest")
    repeats = cout * 4 // cin
    with torch.no_grad():
        c = F.conv2d(up, conv.weight, None, 1, 1).add_(conv.bias.view(1, -1, 1, 1))
        want = c + F.pixel_shuffle(x.repeat_interleave(repeats, dim=1), 2)
        got = UP_SHORTCUT.reference(up, x, conv, repeats)
    assert torch.equal(got, want) and got.dtype == want.dtype


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_up_nearest_plan_equals_eager(layout, dtype):
    x = torch.randn(2, 6, 3, 5).to(dtype).contiguous(memory_format=LAYOUTS[layout])
    want, got = UP_NEAREST.eager(x), UP_NEAREST.reference(x)
    assert torch.equal(got, want) and got.stride() == want.stride()


def _tiny_vae(dtype):
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    vae = AutoencoderDC(**compose_cfg(["output_dir=/tmp/x"]).model.tiny.vae).to(dtype).eval()
    with torch.no_grad():  # non-trivial norm weights and biases (the class makes them 1 and 0)
        for name, p in vae.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape))
    return vae


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_rules_keep_the_decode_bytes(dtype, tmp_path):
    vae = _tiny_vae(dtype)
    z = torch.randn(2, vae.config.latent_channels, 8, 8).to(dtype)
    with torch.no_grad():
        want = vae.decode(z, return_dict=False)[0]
        fx = install_fusions(vae, backend="reference")
        fx.verifier.cache = VerdictCache(tmp_path / "verdicts.json")
        first, again = (vae.decode(z, return_dict=False)[0] for _ in range(2))
    assert torch.equal(first, want) and torch.equal(again, want)
    rules = [rule for rule, _, _ in fx.installed]
    # the decoder, its 3 ResBlocks, 3 up blocks and EfficientViT block, and the encoder's (the same classes)
    assert (rules.count("dc_ae_decoder"), rules.count("dc_ae_resblock"), rules.count("dc_ae_up_block"),
            rules.count("dc_ae_efficientvit")) == (1, 6, 3, 2), rules
    c = fx.counters
    assert c.forwards_verified == 8 and c.forwards_rejected == 0, c.rejections  # the decoder's blocks ran
    # On the CPU oneDNN adds a conv's bias inside the conv, so the three conv chains differ from eager and
    # run eager for good; the norm chain is the CPU's own aten ops in eager's order, and runs fused.
    assert all(r.startswith(("conv_bias_silu", "conv_bias_glu", "up_shortcut")) for r in c.rejections), c.rejections
    assert c.verified > 0 and c.fused_calls > 0
    assert fx.remove() == 12
    with torch.no_grad():
        assert torch.equal(vae.decode(z, return_dict=False)[0], want)


def test_the_rules_skip_blocks_they_do_not_know():
    from diffusers.models.autoencoders.autoencoder_dc import DCUpBlock2d, ResBlock

    assert dc_ae.check_resblock(ResBlock(8, 8, norm_type="rms_norm", act_fn="silu").eval()) is None
    assert "RMSNorm" in dc_ae.check_resblock(ResBlock(8, 8, norm_type="batch_norm", act_fn="silu").eval())
    assert "SiLU" in dc_ae.check_resblock(ResBlock(8, 8, norm_type="rms_norm", act_fn="relu").eval())
    assert "training" in dc_ae.check_resblock(ResBlock(8, 8, norm_type="rms_norm", act_fn="silu"))
    assert dc_ae.check_up_block(DCUpBlock2d(16, 8, interpolate=True, shortcut=True).eval()) is None
    assert "interpolation" in dc_ae.check_up_block(DCUpBlock2d(16, 8, interpolate=False, shortcut=True).eval())

    class ResBlock2(nn.Module):  # another library's block of the same name is not DC-AE's
        pass

    ResBlock2.__name__ = "ResBlock"
    assert "not DC-AE's" in dc_ae.check_resblock(ResBlock2().eval())
