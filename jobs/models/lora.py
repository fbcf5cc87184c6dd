"""LoRA adapters (`model.loras`), fused into the pipeline's weights before any graph exists.

Per LoRA, in order, diffusers' own loader methods on the pipeline: `load_lora_weights(path)`
(diffusers reads the file and converts its key format: diffusers/peft, kohya, ...) and
`fuse_lora(lora_scale=scale)`; then `unload_lora_weights()` removes peft's adapter modules. The
fused weights remain and the transformer is the plain diffusers module again, so the bcg runner
wraps ordinary layers with no per-call LoRA branch, and replay equals eager with the same LoRA.
The result equals the same three calls made by hand (tests/test_models_lora.py).

Each LoRA must reach the pipeline whole: one some of whose tensors match no layer (a LoRA for
another model, or a key format diffusers does not convert for this pipeline) is refused before it
is fused (jobs/models/lora_match.py). Each LoRA is fused before the next loads, each at its own
scale. Fusing rounds once, into the storage dtype: images differ from an unfused adapter run by
float rounding (3.6e-7 on the tiny SANA preset), not by the LoRA's effect.

Needs peft >= 0.17: below that diffusers 0.42 turns its PEFT backend off (MIN_PEFT_VERSION) and
its LoRA methods refuse to run. Install it with `pip install 'bcgen[lora]'`.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Sequence

from jobs.config import LoraConfig
from jobs.errors import UserError
from jobs.models.lora_match import check_lora_reached

log = logging.getLogger(__name__)


def check_loras(loras: Sequence[LoraConfig], pipeline_class: str) -> None:
    """Everything about `model.loras` that can be wrong, found before any model loads."""
    if not loras:
        return
    import diffusers
    from diffusers.utils import USE_PEFT_BACKEND

    if not hasattr(getattr(diffusers, pipeline_class), "load_lora_weights"):
        raise UserError(f"model.loras is set, but diffusers {diffusers.__version__}'s {pipeline_class} has no LoRA "
                         f"loader (load_lora_weights); remove model.loras for this model")
    if not USE_PEFT_BACKEND:
        raise UserError("model.loras needs peft>=0.17 (diffusers' PEFT backend) and it is not installed or too old; "
                         "pip install 'bcgen[lora]'")
    for i, lora in enumerate(loras):
        check_lora_file(f"model.loras[{i}].path", Path(lora.path).expanduser())


def check_lora_file(key: str, path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise UserError(f"{key}={str(path)!r} does not exist or is not a file; pass a local LoRA .safetensors file")
    if path.suffix != ".safetensors":
        raise UserError(f"{key}={str(path)!r}: LoRAs load from safetensors only (a pickled .bin/.pt runs code when "
                         f"it loads); convert it with safetensors.torch.save_file")
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
    except (SafetensorError, OSError) as e:
        raise UserError(f"{key}={str(path)!r} is not a readable safetensors file ({e})") from None
    if not any("lora" in k.lower() for k in keys):
        raise UserError(f"{key}={str(path)!r} holds no LoRA weights (no tensor name contains 'lora', e.g. "
                         f"{keys[:2]}); is it a model checkpoint? Pass a LoRA file")


def apply_loras(pipe, loras: Sequence[LoraConfig], pipeline_class: str) -> None:
    """Fuse each LoRA into `pipe`'s weights, in order, then drop the adapter modules."""
    if not loras:
        return
    check_loras(loras, pipeline_class)
    for i, lora in enumerate(loras):
        name, path = f"bcgen_lora_{i}", Path(lora.path).expanduser()
        pipe.load_lora_weights(str(path), adapter_name=name, local_files_only=True, use_safetensors=True)
        check_lora_reached(pipe, path, name, f"model.loras[{i}].path")  # diffusers only warns about the rest
        # Every component this LoRA reached (e.g. Flux's text encoder too), not only the default
        # "transformer": unload would silently drop an unfused component's part of the LoRA.
        components = sorted(c for c, names in pipe.get_list_adapters().items() if name in names)
        pipe.fuse_lora(components=components, lora_scale=lora.scale, adapter_names=[name])
        log.info("fused LoRA %s at scale %g into %s", lora.path, lora.scale, ", ".join(components))
    pipe.unload_lora_weights()


def lora_identity(loras: Sequence[LoraConfig]) -> dict:
    """{"loras": [path, scale, sha256]} for the run identity; {} without LoRAs (older run.json files match).

    The digest: a LoRA retrained and saved under the same name must not resume into the old run.
    """
    if not loras:
        return {}
    out = []
    for lora in loras:
        h = hashlib.sha256()
        with open(Path(lora.path).expanduser(), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out.append({"path": lora.path, "scale": lora.scale, "sha256": h.hexdigest()})
    return {"loras": out}
