"""jobs/models/flops/z_image.py against torch's own FLOP counter, on tiny real ZImageTransformer2DModels (CPU).

Inputs are built as ZImagePipeline (diffusers 0.42.1) builds them for one forward: a list of
latents [C, 1, h, w] (with CFG the latents twice), the timestep per row, and a list of captions at
their native length (with CFG the positives, then the negatives). The math SDPA backend is forced
so attention's two products reach the counter as bmm's."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.plan import Signature

ROOT = Path(__file__).resolve().parents[1]
PRESET = yaml.safe_load((ROOT / "conf/model/z_image_tiny.yaml").read_text())["model"]["tiny"]

# dim 66 with 4 heads of 16: the attention is 64 wide, not dim; two patch sizes, the pipeline uses 2-1.
ODD = dict(all_patch_size=(1, 2), all_f_patch_size=(1, 1), in_channels=8, dim=66, n_layers=2, n_refiner_layers=1,
           n_heads=4, n_kv_heads=2, qk_norm=False, cap_feat_dim=24, axes_dims=[4, 6, 6], axes_lens=[256, 32, 32])
# dim 272 > 256: the timestep embedding and the adaLN inputs are 256 wide, not dim (one block each).
WIDE = dict(in_channels=4, dim=272, n_layers=1, n_refiner_layers=1, n_heads=17, n_kv_heads=17, cap_feat_dim=16,
            axes_dims=[4, 6, 6], axes_lens=[256, 32, 32])


def _signature(height, width, text, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=4.0 if cfg else 0.0,
                     cfg=cfg, dtype="float32")


def _model(config):
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    model = ZImageTransformer2DModel(**config).eval()
    with torch.no_grad():  # as the family's build_tiny: trained pad tokens are not zero
        model.x_pad_token.normal_()
        model.cap_pad_token.normal_()
    return model


def _forward(model, lat_h, lat_w, captions):
    """One transformer call as ZImagePipeline makes it: `captions` is the pipeline's list (positives,
    then with CFG the negatives), so the latent is repeated to len(captions) rows."""
    rows = len(captions)
    latents = torch.randn(1, model.config.in_channels, lat_h, lat_w).repeat(rows, 1, 1, 1)
    x = list(latents.unsqueeze(2).unbind(dim=0))
    t = (1000 - torch.tensor(700.0).expand(rows)) / 1000
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model(x, t, captions, return_dict=False)[0]
    assert [tuple(o.shape) for o in out] == [(model.config.in_channels, 1, lat_h, lat_w)] * rows
    return counter


def _prompt_flops(counter) -> int:
    """The counter's FLOPs of the caption embedder and the context refiner's blocks."""
    counts = counter.get_flop_counts()
    return sum(sum(counts[name].values()) for name in counts
               if name.endswith(".cap_embedder") or re.search(r"\.context_refiner\.\d+$", name))


def _captions(config, *lengths):
    return [torch.randn(n, config["cap_feat_dim"]) for n in lengths]


# (config, vae config, latent h x w, caption lengths: positive[, negative]). Pixels = latent x the VAE's scale.
CASES = {
    # the preset itself with its 4x VAE; a caption of exactly 32; 4 x 4 = 16 image tokens, padded to 32
    "preset": (PRESET["transformer"], PRESET["vae"], 4, (8, 8), (32,)),
    # CFG: positive 45 and negative 33, both 64 inside the model; 5 x 3 = 15 image tokens; the 8x VAE by default
    "odd_cfg": (ODD, None, 8, (10, 6), (45, 33)),
    # a caption of 70 (96 inside), 8 x 6 = 48 image tokens (64 inside)
    "wide": (WIDE, {"block_out_channels": [8, 8, 8, 8]}, 8, (16, 12), (70,)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_z_image_count_equals_the_flop_counter(case):
    config, vae, scale, (lat_h, lat_w), lengths = CASES[case]
    model = _model(config)
    counter = _forward(model, lat_h, lat_w, _captions(model.config, *lengths))
    cfg = len(lengths) == 2
    # The plan's bucket under CFG is the longer of the positive and the negative (jobs/plan/resolve.py).
    count = transformer_flops("z_image", model.config, vae, _signature(lat_h * scale, lat_w * scale, max(lengths),
                                                                       cfg=cfg))
    assert count.rows == len(lengths)
    assert count.per_forward * count.rows == counter.get_total_flops()
    # The prompt part is what depends on the caption alone: its embedder and the unmodulated context refiner.
    prompt = _prompt_flops(counter)
    assert prompt > 0 and count.per_forward_prompt * count.rows == prompt


def test_a_negative_in_fewer_blocks_of_32_only_saves_its_caption_embedder():
    """The one place the rule overcounts (under CFG): the caption embedder runs on each caption padded to
    its own multiple of 32, everything else on the batch's longest. A negative of 7 tokens (32 inside)
    beside a positive of 40 (64 inside) saves exactly the embedder's 32 rows."""
    config = dict(ODD)
    model = _model(config)
    counter = _forward(model, 6, 6, _captions(config, 40, 7))
    count = transformer_flops("z_image", model.config, None, _signature(48, 48, 40, cfg=True))
    saved = 2.0 * (64 - 32) * config["cap_feat_dim"] * config["dim"]
    assert 2 * count.per_forward - counter.get_total_flops() == saved


def test_the_tiny_presets_partial_config_counts_as_its_model():
    from diffusers import ZImageTransformer2DModel

    partial = dict(PRESET["transformer"])
    model = ZImageTransformer2DModel(**partial)
    full = dict(model.config)
    assert set(full) > set(partial)  # the preset leaves keys to the class defaults
    for sig in (_signature(64, 64, 77, steps=4, cfg=True), _signature(1024, 768, 300, steps=9)):
        assert transformer_flops("z_image", partial, PRESET["vae"], sig) == \
            transformer_flops("z_image", full, PRESET["vae"], sig)
    # and the published config (the class defaults) counts the same as an empty partial config
    published = {k: v.default for k, v in inspect.signature(ZImageTransformer2DModel.__init__).parameters.items()
                 if k != "self"}
    sig = _signature(1024, 1024, 77, steps=9)
    assert transformer_flops("z_image", {}, None, sig) == transformer_flops("z_image", published, None, sig)


def test_z_image_6b_at_1024_is_about_5_05e14_an_image_turbo():
    """Z-Image(-Turbo) 6B, 1024², a 77-token caption (benchmarks/families_image.py's text).

    By hand: dim d = 3840, SwiGLU width h = int(3840 / 3 * 8) = 10240; a block's token-wise weights
    W = 4 d² + 3 d h = 58,982,400 + 117,964,800 = 176,947,200. Tokens: (1024 / 16)² = 4096 image,
    77 -> 96 caption (padded to 32), s = 4192 joined.
      30 main blocks:       30 x (2 W s + 4 s² d)     = 30 x (1.4835e12 + 2.699e11) = 5.260e13
      2 noise refiners:     2 x (2 W 4096 + 4 4096² d) = 2 x (1.4496e12 + 2.577e11) = 3.415e12
      2 context refiners:   2 x (2 W 96 + 4 96² d)                                  = 6.82e10
      embedders and final:  2 x 3840 x (4096 x 64 + 96 x 2560 + 4192 x 64)          = 5.97e9
    = 5.609e13 a forward; Turbo: 9 steps (9 forwards in diffusers), no CFG: 5.048e14 an image.
    The base model at 50 steps with CFG: 100 forwards, 5.609e15. Without the caption padding
    (s = 4173) the Turbo figure drops to about 5.03e14; without the attention to about 4.3e14."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from diffusers import ZImageTransformer2DModel
    from families_image import REAL

    published = dict(REAL["z_image"])
    defaults = {k: v.default for k, v in inspect.signature(ZImageTransformer2DModel.__init__).parameters.items()}
    assert all(list(v) == list(defaults[k]) if isinstance(v, (list, tuple)) else v == defaults[k]
               for k, v in published.items())  # the class defaults are the released config
    vae = {"block_out_channels": [128, 256, 512, 512]}  # the released AutoencoderKL: 8x
    turbo = transformer_flops("z_image", published, vae, _signature(1024, 1024, 77, steps=9))
    assert turbo.rows == 1 and turbo.steps == 9
    assert 5.04e14 < turbo.per_image < 5.06e14
    base = transformer_flops("z_image", published, vae, _signature(1024, 1024, 77, steps=50, cfg=True))
    assert base.rows == 2 and base.per_image == 100 * base.per_forward
    assert 5.59e15 < base.per_image < 5.63e15
    # The prompt part (caption embedder + 2 context refiners at 96 tokens) is about 7.0e10 a forward.
    assert 6.9e10 < turbo.per_forward_prompt < 7.1e10
