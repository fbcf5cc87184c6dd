"""jobs/models/flops/longcat_image.py against torch's own FLOP counter, on tiny real LongCat-Image
transformers (CPU), and through LongCatImagePipeline itself as the job calls it (precomputed 512-position
embeddings, prompt rewriting off).

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

PRESET = Path(__file__).resolve().parents[1] / "conf" / "model" / "longcat_image_tiny.yaml"
TINY = dict(in_channels=64, num_layers=2, num_single_layers=3, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=24, pooled_projection_dim=24, axes_dims_rope=[4, 6, 6])
VAE_8X = {"block_out_channels": [8, 8, 8, 8]}  # AutoencoderKL of 4 blocks: the published 8x
VAE_4X = {"block_out_channels": [8, 8, 8]}


def _signature(height, width, text, steps=1, cfg=False):
    return Signature(height=height, width=width, text_bucket=text, steps=steps, guidance_scale=4.5 if cfg else 1.0,
                     cfg=cfg, dtype="float32")


def _preset() -> dict:
    return yaml.safe_load(PRESET.read_text())["model"]


def _counted(run) -> FlopCounterMode:
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        run()
    return counter


def _module_flops(counter: FlopCounterMode, suffix: str) -> int:
    return sum(sum(v.values()) for name, v in counter.get_flop_counts().items() if name.endswith(suffix))


def _forward_inputs(rows: int, text: int, height: int, width: int, vae_scale: int, joint: int) -> dict:
    """One transformer call's inputs as LongCatImagePipeline builds them: 16-channel latents of
    2 * (side // (2 * vae_scale)) packed 2x2 into tokens, text ids 0.. on two axes, image ids offset by 512."""
    from diffusers import LongCatImagePipeline
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

    lh, lw = 2 * (height // (vae_scale * 2)), 2 * (width // (vae_scale * 2))
    latents = LongCatImagePipeline._pack_latents(torch.randn(rows, 16, lh, lw), rows, 16, lh, lw)
    return dict(hidden_states=latents, timestep=torch.full((rows,), 0.7), guidance=None,
                encoder_hidden_states=torch.randn(rows, text, joint),
                txt_ids=prepare_pos_ids(modality_id=0, type="text", start=(0, 0), num_token=text),
                img_ids=prepare_pos_ids(modality_id=1, type="image", start=(512, 512), height=lh // 2, width=lw // 2))


@pytest.mark.parametrize("text,height,width,vae,patch,layers", [
    (512, 64, 64, VAE_4X, 1, (1, 1)),  # the pipeline's fixed 512 text positions, the tiny preset's 4x VAE
    (20, 96, 128, VAE_8X, 2, (2, 3)),  # a short text, a non-square image, a patch size of 2 (wider output)
    (7, 72, 40, None, 1, (2, 1)),      # sides not multiples of 16: the pipeline floors; no VAE config: 8x
])
def test_count_equals_the_flop_counter(text, height, width, vae, patch, layers):
    from diffusers import LongCatImageTransformer2DModel

    torch.manual_seed(0)
    config = dict(TINY, patch_size=patch, num_layers=layers[0], num_single_layers=layers[1])
    model = LongCatImageTransformer2DModel(**config).eval()
    rows = 3
    scale = 2 ** (len(vae["block_out_channels"]) - 1) if vae else 8
    inputs = _forward_inputs(rows, text, height, width, scale, 24)
    counter = _counted(lambda: model(**inputs, return_dict=False))
    count = transformer_flops("longcat_image", dict(model.config), vae, _signature(height, width, text))
    assert count.per_forward * rows == counter.get_total_flops()
    # The prompt part is the context embedder: all later text work runs on a stream the blocks update.
    assert count.per_forward_prompt * rows == _module_flops(counter, "context_embedder") > 0


@pytest.mark.parametrize("guidance,steps", [(4.5, 2), (1.0, 3)])
def test_the_pipeline_runs_what_the_count_says(guidance, steps):
    """LongCatImagePipeline called as jobs/models/longcat_image.py calls it (precomputed embeddings, the
    negative's too, prompt rewriting off), on the tiny preset's transformer and VAE: every transformer
    FLOP of the whole denoise loop is one image's count, two calls a step under CFG, one without."""
    from diffusers import AutoencoderKL, LongCatImagePipeline, LongCatImageTransformer2DModel

    from jobs.models.longcat_image import TEXT_LENGTH, accept_embeddings
    from jobs.models.tiny import build_scheduler

    tiny = _preset()["tiny"]
    torch.manual_seed(0)
    pipe = LongCatImagePipeline(scheduler=build_scheduler(tiny["scheduler"]),
                                vae=AutoencoderKL(**tiny["vae"]).eval(), text_encoder=None, tokenizer=None,
                                text_processor=None,
                                transformer=LongCatImageTransformer2DModel(**tiny["transformer"]).eval())
    accept_embeddings(pipe)
    joint, cfg = tiny["transformer"]["joint_attention_dim"], guidance > 1
    height, width = 64, 96
    counter = _counted(lambda: pipe(
        prompt_embeds=torch.randn(1, TEXT_LENGTH, joint),
        negative_prompt_embeds=torch.randn(1, TEXT_LENGTH, joint) if cfg else None, guidance_scale=guidance,
        enable_prompt_rewrite=False, num_inference_steps=steps, height=height, width=width, output_type="latent"))
    count = transformer_flops("longcat_image", tiny["transformer"], tiny["vae"],
                              _signature(height, width, TEXT_LENGTH, steps=steps, cfg=cfg))
    assert count.rows == (2 if cfg else 1)
    assert count.per_image == counter.get_total_flops() == _module_flops(counter, "LongCatImageTransformer2DModel")
    assert count.steps * count.rows * count.per_forward_prompt == _module_flops(counter, "context_embedder")


def test_published_size_at_1024_is_about_3_9e15_an_image():
    """meituan-longcat/LongCat-Image (benchmarks/families_image.py REAL): 10 double + 20 single blocks,
    d = 24 x 128 = 3072, text 3584 wide; 1024², the preset's 50 steps, CFG (two calls a step), 512 text.
    By hand: tokens n = (1024 / 16)² = 4096 image + 512 text, s = 4608. Every block, double or single,
    holds 12 d² weights a token (double: q, k, v, out 4 d² + MLP 8 d² per stream; single: q, k, v 3 d²,
    MLP up 4 d², out 5 d²), so 2 x 12 d² x s = 1.044e12, plus attention 4 s² d = 2.61e11: 1.305e12 a block,
    30 blocks 3.914e13; embedders and the output ~1.5e10 and the adaLN linears ~1e9 more: ~3.92e13 a
    forward, x 50 steps x 2 rows = ~3.92e15 an image."""
    config = dict(patch_size=1, in_channels=64, num_layers=10, num_single_layers=20, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=3584, pooled_projection_dim=3584,
                  axes_dims_rope=[16, 56, 56])
    sig = _signature(1024, 1024, 512, steps=_preset_steps(), cfg=True)
    count = transformer_flops("longcat_image", config, {"block_out_channels": [128, 256, 512, 512]}, sig)
    assert count.rows == 2 and count.steps == 50
    assert 3.90e15 < count.per_image < 3.95e15
    # the context embedder: 2 x 512 x 3584 x 3072 = 1.13e10 a forward
    assert 1.12e10 < count.per_forward_prompt < 1.14e10


def _preset_steps() -> int:
    return int(yaml.safe_load((PRESET.parent / "longcat_image.yaml").read_text())["sampling"]["steps"])


def test_partial_configs_read_the_class_defaults():
    from diffusers import LongCatImageTransformer2DModel

    tiny = _preset()["tiny"]
    sig = _signature(64, 64, 512, steps=4, cfg=True)
    partial = dict(tiny["transformer"])
    torch.manual_seed(0)
    model = LongCatImageTransformer2DModel(**partial)
    full = transformer_flops("longcat_image", dict(model.config), tiny["vae"], sig)
    assert transformer_flops("longcat_image", partial, tiny["vae"], sig) == full
    # A key left out (or null) is the class's default: drop every preset key whose value is the default.
    defaults = {k: p.default for k, p in inspect.signature(LongCatImageTransformer2DModel.__init__).parameters.items()
                if k != "self"}
    dropped = {k: v for k, v in partial.items() if v != defaults[k]}
    assert len(dropped) < len(partial)  # patch_size and in_channels are the defaults
    assert transformer_flops("longcat_image", dropped, tiny["vae"], sig) == full
    assert transformer_flops("longcat_image", dict(partial, patch_size=None), tiny["vae"], sig) == full
    # An empty config is the class's defaults (19 double, 38 single blocks of 3072).
    big = _signature(1024, 1024, 512, steps=4, cfg=True)
    assert transformer_flops("longcat_image", {}, None, big) == transformer_flops("longcat_image", defaults, None, big)
