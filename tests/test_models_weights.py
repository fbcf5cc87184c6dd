"""Every preset's pipeline, tiny or loaded, runs in eval mode with frozen weights; a loaded one owns
aligned weights.

Issue 16: on an AMD EPYC the weights `from_pretrained` left in the safetensors file mapping sat
at misaligned addresses and took another kernel path, so a loaded checkpoint gave other images
than the same weights in memory; and the tiny presets ran their transformer and VAE in training
mode.
"""

from __future__ import annotations

import gc
import operator
from pathlib import Path

import pytest
import torch

from jobs.models.weights import CPU_ALIGNMENT, own_weights, owns_aligned_memory, torch_modules
from jobs.models.weights import forward_only as weights_forward_only
from tests.helpers import CONF_DIR, compose_cfg, tiny_pipeline

# (tiny preset, the real preset that loads a folder the tiny one saved)
PRESETS = [("sana_tiny", "sana"), ("flux_tiny", "flux"), ("qwen_image_tiny", "qwen_image"),
           ("longcat_image_tiny", "longcat_image"), ("z_image_tiny", "z_image"), ("wan_tiny", "wan"),
           ("sana_video_tiny", "sana_video"), ("ltx2_tiny", "ltx2"), ("glm_image_tiny", "glm_image"),
           ("minimax_h3_tiny", "minimax_h3")]


def test_every_preset_is_listed():
    assert {p.stem for p in Path(CONF_DIR, "model").glob("*.yaml")} == {name for pair in PRESETS for name in pair}


def training_modules(pipe) -> list:
    return [f"{name}.{sub}" for name, module in torch_modules(pipe).items()
            for sub, m in module.named_modules() if m.training]


def trainable(pipe) -> list:
    return [f"{name}.{n}" for name, module in torch_modules(pipe).items()
            for n, p in module.named_parameters() if p.requires_grad]


def mapped(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("tiny,real", PRESETS)
def test_tiny_and_loaded_pipelines_are_in_eval_mode_and_own_their_weights(tiny, real, tmp_path):
    cfg, fam, pipe = tiny_pipeline(tiny)
    assert set(torch_modules(pipe)) >= {"transformer", "vae", "text_encoder"}
    assert training_modules(pipe) == [] and trainable(pipe) == []
    path = tmp_path / f"{tiny}_diffusers"
    fam.save(pipe, path)
    del pipe

    real_cfg = compose_cfg([f"model={real}", f"model.path={path}", "model.dtype=float32", "output_dir=/tmp/x"])
    loaded = fam.load(real_cfg.model, torch.float32)
    assert training_modules(loaded) == [] and trainable(loaded) == []
    tensors = [(f"{name}.{n}", t) for name, module in torch_modules(loaded).items()
               for n, t in list(module.named_parameters()) + list(module.named_buffers())]
    assert [n for n, t in tensors if not owns_aligned_memory(t)] == []
    gc.collect()
    if Path("/proc/self/maps").exists():
        assert not mapped(path), "a loaded CPU pipeline still maps its checkpoint files"


def aten_ops(fn) -> set:
    from torch.profiler import profile

    with torch.inference_mode(), profile() as prof:
        fn()
    return {e.name for e in prof.events()}


def test_a_frozen_linear_takes_a_strided_input_without_copying_it():
    """Why eval_mode freezes: with its weight trainable, matmul folds a strided 3-D input into a copy
    first (ATen's should_fold), even under inference_mode; SANA's attention out-projection gets the
    linear attention's [B, D, N] memory as [B, N, D], 73 MB a call at SANA-1.6B size, 1024², batch 8."""
    _, _, pipe = tiny_pipeline("sana_tiny")
    linear = pipe.transformer.transformer_blocks[0].attn1.to_out[0]
    x = torch.randn(2, linear.in_features, 16).transpose(1, 2)
    frozen = aten_ops(lambda: torch.matmul(x, linear.weight.t()))
    assert "aten::copy_" not in frozen and "aten::bmm" in frozen
    linear.weight.requires_grad_(True)  # as from_pretrained leaves it
    assert "aten::copy_" in aten_ops(lambda: torch.matmul(x, linear.weight.t()))


def test_own_weights_moves_misaligned_external_storage_and_keeps_ties():
    # A weight inside an external buffer at a misaligned offset, as a safetensors mapping gives it.
    values = torch.arange(48, dtype=torch.float32)
    raw = bytearray(128 + values.nbytes)
    at = (24 - torch.frombuffer(raw, dtype=torch.uint8).data_ptr()) % CPU_ALIGNMENT  # address % 64 == 24
    external = torch.frombuffer(raw, dtype=torch.float32, offset=at, count=48).view(6, 8)
    external.copy_(values.view(6, 8))
    linear = torch.nn.Linear(8, 6, bias=False)
    linear.weight.data = external
    tied = torch.nn.Embedding(6, 8)
    tied.weight = linear.weight

    class Pipe:  # the one attribute own_weights reads from a diffusers pipeline
        components = {"transformer": torch.nn.ModuleDict({"proj": linear, "embed": tied}), "tokenizer": object()}

    assert not owns_aligned_memory(linear.weight) and linear.weight.data_ptr() % CPU_ALIGNMENT == 24
    assert own_weights(Pipe, "cpu") == values.nbytes  # the tied weight is copied once
    assert owns_aligned_memory(linear.weight) and tied.weight is linear.weight
    assert torch.equal(linear.weight, values.view(6, 8))
    raw[at + 4:at + 8] = bytes(4)  # element [0, 1] of the external buffer: the module no longer reads it
    assert external[0, 1].item() == 0.0 and linear.weight[0, 1].item() == 1.0


def test_own_weights_leaves_device_runs_to_the_device_copy():
    linear = torch.nn.Linear(2, 2)
    before = linear.weight.data_ptr()

    class Pipe:
        components = {"transformer": linear}

    assert own_weights(Pipe, torch.device("cuda")) == 0 and linear.weight.data_ptr() == before


ENCODE_PROMPTS = ["a red fox on a quiet lake at dawn", "misty mountain",
                  "an old stone bridge over a river in the morning light, birds over the water"]


@pytest.mark.parametrize("tiny", [t for t, _ in PRESETS])
def test_text_encoders_run_without_a_kv_cache_and_encode_the_same_bytes(tiny, monkeypatch):
    """prepare() turns the text encoder's KV cache off (Gemma2's cache start synchronises the host
    on every sliding-window layer); the embeddings must not change by a bit, so encode with it back
    on too."""
    import jobs.models.weights as weights

    turned_off: list = []
    real = weights.forward_only
    monkeypatch.setattr(weights, "forward_only", lambda pipe, names: turned_off.extend(real(pipe, names)))
    cfg, fam, pipe = tiny_pipeline(tiny)
    configs = {key: operator.attrgetter(key)(pipe) for key in turned_off}  # "text_encoder.config"
    assert all(c.use_cache is False for c in configs.values())
    if not configs:
        pytest.skip(f"{tiny}: its text encoder keeps no KV cache")

    def encode():  # a prompt a call: MiniMax-H3 encodes one text length a batch
        with torch.inference_mode():
            return [(e.embeds.clone(), e.mask.clone())
                    for e in (fam.encode(pipe, [p], cfg.model, "cpu", instruction=True) for p in ENCODE_PROMPTS)]

    without = encode()
    for c in configs.values():
        c.use_cache = True
    with_cache = encode()
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(without, with_cache))


def test_forward_only_turns_off_the_cache_of_decoder_encoders_only():
    cfg, fam, pipe = tiny_pipeline("sana_video_tiny")  # Gemma2, as the real SANA and SANA-Video
    assert pipe.text_encoder.config.use_cache is False
    pipe.text_encoder.config.use_cache = True
    assert weights_forward_only(pipe, ("text_encoder", "transformer", "absent")) == ["text_encoder.config"]
    assert weights_forward_only(pipe, ("text_encoder",)) == []  # already off
