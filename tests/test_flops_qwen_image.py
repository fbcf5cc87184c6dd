"""jobs/models/flops/qwen_image.py against torch's own FLOP counter, on a tiny real
QwenImageTransformer2DModel (CPU, float32), called as QwenImagePipeline calls it for one step.

The math SDPA backend is forced so attention's two products reach the counter as bmm's on every
machine (the fused CPU kernels are not all in its registry)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import transformer_flops
from jobs.plan import Signature

TINY = dict(in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
            axes_dims_rope=(4, 6, 6))
PRESET = Path(__file__).resolve().parents[1] / "conf" / "model" / "qwen_image_tiny.yaml"


def _signature(height, width, text, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=4.0 if cfg else 1.0,
                     cfg=cfg, dtype="float32")


def _pipeline_inputs(model, rows: int, h: int, w: int, text: int, real: int) -> dict:
    """One transformer call of QwenImagePipeline.__call__'s loop: latents packed 2x2 into h x w tokens
    of in_channels, timestep / 1000, the text bucket's embeddings with their long mask (the job's
    padder right-pads with mask 0), img_shapes [[(1, h, w)]] a row, guidance None (not distilled)."""
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(rows, text, dtype=torch.long)
    mask[:, :real] = 1  # padded positions are still computed: the count does not depend on the mask
    return dict(hidden_states=torch.randn(rows, h * w, model.config.in_channels, generator=g),
                timestep=torch.full((rows,), 700.0) / 1000,
                guidance=None,
                encoder_hidden_states_mask=mask,
                encoder_hidden_states=torch.randn(rows, text, model.config.joint_attention_dim, generator=g),
                img_shapes=[[(1, h, w)]] * rows,
                attention_kwargs={})


def _counted(model, inputs) -> FlopCounterMode:
    from jobs.models.qwen_image import capturable_text_lengths

    capturable_text_lengths()  # what the family installs on a loaded pipeline (no FLOPs of its own)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model(**inputs, return_dict=False)[0]
    rows, tokens = inputs["hidden_states"].shape[:2]
    p, c_out = model.config.patch_size, model.out_channels
    assert out.shape == (rows, tokens, p * p * c_out)  # the forward ran through to proj_out
    return counter


def _prompt_flops(counter: FlopCounterMode) -> int:
    by_module = counter.get_flop_counts()
    return sum(sum(by_module[name].values()) for name in by_module if name.endswith(".txt_in"))


@pytest.mark.parametrize("extra,rows,h,w,text,real", [
    (dict(patch_size=2, out_channels=4), 2, 4, 6, 7, 5),  # the tiny preset's layout
    (dict(patch_size=1, in_channels=8, out_channels=None), 1, 5, 3, 12, 12),  # null: in_channels (8, not 16) out
    (dict(zero_cond_t=True, guidance_embeds=True), 3, 3, 3, 4, 1),  # timestep batch doubled; no guidance embedder
])
def test_count_equals_the_flop_counter(extra, rows, h, w, text, real):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**{**TINY, **extra}).eval()
    counter = _counted(model, _pipeline_inputs(model, rows, h, w, text, real))
    # h x w packed tokens are an image of (16 h) x (16 w) with the default (released) 8x VAE
    count = transformer_flops("qwen_image", model.config, None, _signature(h * 16, w * 16, text))
    assert count.per_forward * rows == counter.get_total_flops()
    # The prompt part is what depends on the prompt alone: txt_in (every block mixes in the timestep).
    assert count.per_forward_prompt * rows == _prompt_flops(counter) > 0


def test_reads_the_vae_scale_from_its_config():
    """The tiny preset's VAE has two temperal_downsample entries: 4x, so 8 pixels a packed token."""
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**TINY).eval()
    counter = _counted(model, _pipeline_inputs(model, 1, 3, 5, 6, 6))
    vae = {"temperal_downsample": [False, True]}
    # 31 x 47 pixels: the pipeline floors to whole packed tokens (3 x 5 at 8 pixels each)
    assert transformer_flops("qwen_image", model.config, vae, _signature(31, 47, 6)).per_forward == \
        counter.get_total_flops()
    assert transformer_flops("qwen_image", model.config, None, _signature(24, 40, 6)).per_forward < \
        counter.get_total_flops()  # the same pixels with the 8x default are fewer tokens


def test_cfg_is_a_second_row():
    """QwenImagePipeline runs the negative branch as a second transformer call every step."""
    one = transformer_flops("qwen_image", dict(TINY), None, _signature(256, 256, 64, steps=20))
    two = transformer_flops("qwen_image", dict(TINY), None, _signature(256, 256, 64, steps=20, cfg=True))
    assert (one.rows, two.rows) == (1, 2)
    assert two.per_image == 2 * one.per_image == 2 * 20 * one.per_forward


def test_the_tiny_presets_partial_config_counts_as_its_model():
    from diffusers import QwenImageTransformer2DModel

    tiny = yaml.safe_load(PRESET.read_text())["model"]["tiny"]
    section, vae = tiny["transformer"], tiny["vae"]
    model = QwenImageTransformer2DModel(**section)
    sig = _signature(64, 96, 64, steps=4, cfg=True)
    partial = transformer_flops("qwen_image", section, vae, sig)
    assert partial == transformer_flops("qwen_image", dict(model.config), vae, sig)
    # and an empty config is the class's defaults, key by key
    defaults = {k: v.default for k, v in inspect.signature(QwenImageTransformer2DModel.__init__).parameters.items()
                if k != "self"}
    assert transformer_flops("qwen_image", {}, None, sig) == transformer_flops("qwen_image", defaults, None, sig)


def test_qwen_image_at_1024_is_about_7_1e15_an_image():
    """The released Qwen/Qwen-Image transformer (benchmarks/families_image.py REAL, = the class defaults),
    1024², 50 steps (the preset's), CFG (two calls a step), text bucket 128 (77 real tokens, as the
    benchmark has it).

    By hand: d = 24 x 128 = 3072, n = (1024 / 16)² = 4096 image tokens, t = 128, s = 4224.
    A stream's linears per token: q, k, v, out (4 d²) and the 4x MLP (8 d²) = 12 d² = 1.1325e8 weights;
    2 FLOPs each: image 2 x 1.1325e8 x 4096 = 9.277e11, text 2 x 1.1325e8 x 128 = 2.90e10 a block.
    Joint attention: 4 s² d = 4 x 4224² x 3072 = 2.193e11 a block. img_mod + txt_mod: 24 d² = 2.3e8.
    A block ~ 1.1759e12; x 60 = 7.055e13. img_in, txt_in, proj_out, the time embedding and norm_out
    add ~ 6e9 (1.6e9 + 2.8e9 + 1.6e9 + ...), so a forward ~ 7.06e13; x 50 steps x 2 rows = 7.06e15.
    (The "2 x params x tokens" check: the 20B params split into 6.8e9 of image-stream linears over
    4096 tokens, as many of text-stream over 128, 6.8e9 of modulation over 1 row each.)"""
    from diffusers import QwenImageTransformer2DModel

    defaults = {k: v.default for k, v in inspect.signature(QwenImageTransformer2DModel.__init__).parameters.items()
                if k != "self"}
    real = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
    vae = {"temperal_downsample": [False, True, True]}  # the released VAE's
    count = transformer_flops("qwen_image", real, vae, _signature(1024, 1024, 128, steps=50, cfg=True))
    assert count == transformer_flops("qwen_image", defaults, None, _signature(1024, 1024, 128, steps=50, cfg=True))
    assert 7.03e15 < count.per_image < 7.09e15
    assert 2.81e9 < count.per_forward_prompt < 2.83e9  # txt_in: 2 x 128 x 3584 x 3072 = 2.818e9 a row
