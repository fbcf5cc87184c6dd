"""On CUDA the copy to the device owns the weights (jobs/models/weights.py leaves it to that copy).

A checkpoint loaded for a GPU run, moved as the engine moves it, holds every tensor in fresh
aligned device memory, no longer maps its safetensors files, and gives the in-memory pipeline's
images bit for bit. Run on the GPU machine: `python -m pytest tests/gpu/test_weights_gpu.py -q`.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from jobs.models.base import DenoiseRequest
from jobs.models.weights import torch_modules
from tests.gpu.test_family_graphs_gpu import tokenizer_overrides
from tests.helpers import compose_cfg, tiny_pipeline

pytestmark = pytest.mark.gpu
CUDA_ALIGNMENT = 256  # cudaMalloc's guarantee; the caching allocator hands out blocks of multiples of 512


def test_a_loaded_checkpoint_on_cuda_owns_aligned_weights_and_matches(tmp_path):
    device = torch.device("cuda")
    tiny_cfg, fam, pipe = tiny_pipeline("flux_tiny", *tokenizer_overrides("flux"))  # `.minilm/` on the GPU machine
    path = tmp_path / "flux_tiny_diffusers"
    pipe.save_pretrained(path, safe_serialization=True)
    cfg = compose_cfg(["model=flux", f"model.path={path}", "model.dtype=float32", "output_dir=/tmp/x", "device=cuda"])
    loaded = fam.load(cfg.model, torch.float32, device).to(device)  # as jobs/worker/model.py's load_pipeline does
    loaded.set_progress_bar_config(disable=True)
    tensors = [(f"{name}.{n}", t) for name, module in torch_modules(loaded).items()
               for n, t in list(module.named_parameters()) + list(module.named_buffers())]
    assert [n for n, t in tensors if t.device.type != "cuda" or t.storage_offset() != 0
            or t.data_ptr() % CUDA_ALIGNMENT] == []
    gc.collect()
    assert str(path) not in Path("/proc/self/maps").read_text()

    def image(p, c):
        with torch.no_grad():
            text = fam.encode(p, ["a castle in the clouds"], c.model, device, instruction=True)
        return fam.denoise_decode(p, DenoiseRequest(positive=text, negative=None, seeds=[5], height=64, width=64,
                                                    steps=2, guidance_scale=3.5))

    assert (image(pipe.to(device), tiny_cfg) == image(loaded, cfg)).all()


@pytest.mark.parametrize("preset", ["sana_video_tiny", "qwen_image_tiny", "z_image_tiny", "ltx2_tiny"])
def test_text_encoders_without_a_kv_cache_encode_the_same_bytes_on_cuda(preset):
    """The CPU test of jobs/models/weights.forward_only, on CUDA in bfloat16: the decoder-LM text
    encoders (Gemma2, Qwen2.5-VL, Qwen3, Gemma3) give the same embeddings with the cache off as on."""
    from tests.test_models_weights import ENCODE_PROMPTS

    cfg, fam, pipe = tiny_pipeline(preset, *tokenizer_overrides(cfg_family(preset)))
    pipe = pipe.to("cuda", torch.bfloat16)
    encoder = pipe.text_encoder.config
    configs = [c for c in (encoder, getattr(encoder, "text_config", None)) if c is not None and hasattr(c, "use_cache")]
    assert configs and all(c.use_cache is False for c in configs)

    def encode():
        with torch.inference_mode():
            return [fam.encode(pipe, [p], cfg.model, "cuda", instruction=True).embeds.clone() for p in ENCODE_PROMPTS]

    without = encode()
    for c in configs:
        c.use_cache = True
    assert all(torch.equal(a, b) for a, b in zip(without, encode()))


def cfg_family(preset: str) -> str:
    return preset.removesuffix("_tiny")
