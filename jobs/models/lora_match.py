"""Whether every tensor of a LoRA file reaches a layer of the model: a LoRA that does not is refused.

diffusers' `load_lora_weights` converts the file's key format (kohya, ...) with the pipeline class's
`lora_state_dict`, keeps the keys prefixed by a component it loads LoRAs into (`transformer.`, Flux's
`text_encoder.`), and peft injects an adapter layer for each module the keys name. What names no module
is dropped with a log warning only, and a layer whose lora_A was dropped keeps a random one: a LoRA for
another model, or in a key format diffusers does not convert for this pipeline, was fused in part (or
not at all, then `fuse_lora` failed with a traceback), and the images silently differed from the ones
asked for.

Checked twice, with one message:
- `check_lora_targets`, with the config checks (jobs/preflight.py), before the run claims output_dir
  and before any weight loads: each converted key for the transformer must name a layer whose weight
  the checkpoint's transformer holds (the tensor names in its safetensors headers). Only where
  model.path's transformer weights are at hand; other components' keys are left to the second check.
- `check_lora_reached`, after diffusers loaded the LoRA and before it is fused (jobs/models/lora.py):
  each key must name a module that now holds the adapter. peft's own layers are the criterion, so it
  follows every conversion diffusers made, for every component and for the tiny presets too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

from jobs.config import LoraConfig
from jobs.errors import UserError

_EXAMPLES = 3  # unmatched keys named in the message


def module_of(key: str) -> Optional[str]:
    """`transformer.blocks.0.to_q` for `transformer.blocks.0.to_q.lora_A.weight`; None for a tensor that is no
    adapter layer's (a kohya `.alpha` folded into the scale, a Flux control LoRA's norm weights)."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.startswith(("lora", "lokr")):
            return ".".join(parts[:i]) if i else None
    return None


def lora_tensors(pipeline_cls, path: Path) -> Dict[str, str]:
    """{key: the module it names} of the file's adapter tensors, in diffusers' format as `load_lora_weights`
    converts them for this pipeline class."""
    out = pipeline_cls.lora_state_dict(str(path), local_files_only=True, use_safetensors=True)
    state_dict = out[0] if isinstance(out, tuple) else out  # some classes add network alphas, metadata
    modules = {k: module_of(k) for k in state_dict}
    return {k: m for k, m in modules.items() if m is not None}


def check_lora_targets(loras: Sequence[LoraConfig], pipeline_class: str, model_path: Optional[str]) -> None:
    """Before the claim and the weights: refuse a LoRA some of whose tensors name no layer of the checkpoint's
    transformer, or a component the pipeline loads no LoRA into (see the module docstring)."""
    if not loras or model_path is None:
        return
    from jobs.models.checkpoint import weight_names

    names = weight_names(os.path.join(model_path, "transformer"))
    if names is None:
        return  # no weights here (a plan): the load's check_lora_reached still runs
    import diffusers

    cls = getattr(diffusers, pipeline_class)
    loadable = list(cls._lora_loadable_modules)
    for i, lora in enumerate(loras):
        path = Path(lora.path).expanduser()
        tensors = lora_tensors(cls, path)
        missed = sorted(k for k, m in tensors.items() if not _may_reach(m, names, loadable))
        _refuse_unmatched(f"model.loras[{i}].path", path, pipeline_class, loadable, len(tensors), missed)


def _may_reach(module: str, transformer_weights: Set[str], loadable: List[str]) -> bool:
    component, _, name = module.partition(".")
    if component not in loadable:
        return False  # load_lora_weights keeps only the keys of components it loads LoRAs into
    # Another component's layers (Flux's text encoder) are checked once it is loaded.
    return component != "transformer" or f"{name}.weight" in transformer_weights


def adapter_modules(pipe, adapter: str) -> Set[str]:
    """`component.module` of every peft layer that holds `adapter`, in the components the pipeline loads
    LoRAs into."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found = set()
    for component in getattr(pipe, "_lora_loadable_modules", ()):
        model = getattr(pipe, component, None)
        if model is None:
            continue
        for name, layer in model.named_modules():
            if isinstance(layer, BaseTunerLayer) and any(
                    adapter in getattr(layer, attr, {}) for attr in layer.adapter_layer_names):
                found.add(f"{component}.{name}")
    return found


def check_lora_reached(pipe, path: Path, adapter: str, key: str) -> None:
    """After `load_lora_weights` loaded `path` as `adapter`, before it is fused: refuse it unless every one of
    its adapter tensors reached a layer of `pipe`."""
    tensors = lora_tensors(type(pipe), path)
    reached = adapter_modules(pipe, adapter)
    missed = sorted(k for k, m in tensors.items() if m not in reached)
    _refuse_unmatched(key, path, type(pipe).__name__, list(pipe._lora_loadable_modules), len(tensors), missed)


def _refuse_unmatched(key: str, path: Path, pipeline_class: str, into: List[str], total: int,
                      missed: List[str]) -> None:
    if not missed:
        return
    examples = ", ".join(repr(k) for k in missed[:_EXAMPLES])
    raise UserError(
        f"{key}={str(path)!r}: {len(missed)} of its {total} LoRA tensors match no layer of {pipeline_class}'s "
        f"{', '.join(into)} ({total - len(missed)} do), e.g. {examples}; fused, the LoRA would apply "
        f"{'in part' if len(missed) < total else 'not at all'} and the images would silently differ. The LoRA is "
        f"for another model, or its keys are in a format diffusers does not convert for this pipeline: pass a "
        f"LoRA trained for this model, or rename its keys to diffusers' format (<component>.<module path>"
        f".lora_A.weight and .lora_B.weight)")
