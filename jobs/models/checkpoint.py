"""Checks on a local diffusers folder, before any weight is read.

A user who points model.path at the wrong folder learns what was expected in it; pickle
checkpoints are refused (a `.bin` can run arbitrary code when loaded), safetensors only.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence, Set

from jobs.errors import UserError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_diffusers_folder(path: str, pipeline_class: str, components: Sequence[str]) -> None:
    where = f"model.path={path!r}"
    if not os.path.isdir(path):
        raise UserError(f"{where} does not exist or is not a directory; pass a local diffusers folder "
                         f"(one holding model_index.json and {', '.join(components)}/)")
    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        raise UserError(f"{where} is not a diffusers folder: model_index.json is missing; expected "
                         f"model_index.json with _class_name {pipeline_class!r} and subfolders "
                         f"{', '.join(components)}/ "
                         f"(save one with pipeline.save_pretrained(DIR))")
    try:
        index = read_json(index_path)
    except (OSError, ValueError) as e:
        raise UserError(f"{index_path}: cannot read model_index.json ({e})") from e
    found = index.get("_class_name")
    if found != pipeline_class:
        raise UserError(f"{index_path}: _class_name is {found!r} but this preset needs {pipeline_class!r}; "
                         f"pick the preset that matches the checkpoint (model=...)")
    missing = [c for c in components if not os.path.isdir(os.path.join(path, c))]
    if missing:
        raise UserError(f"{where}: missing component folder(s) {', '.join(m + '/' for m in missing)}; "
                         f"a {pipeline_class} folder holds {', '.join(c + '/' for c in components)}")
    for comp in components:
        refuse_pickle_only(os.path.join(path, comp))
        _check_config_json(os.path.join(path, comp))


def _check_config_json(folder: str) -> None:
    """A component's config.json parses (the plan reads some: a VAE's scale, a transformer's patch), or is named:
    it was a traceback from the first reader."""
    config = os.path.join(folder, "config.json")
    if not os.path.isfile(config):
        return
    try:
        read_json(config)
    except (OSError, ValueError) as e:
        raise UserError(f"{config}: cannot read it as JSON ({e}); restore the checkpoint's file") from None


def check_weights(path: str, components: Sequence[str]) -> None:
    """What a load will read is there and whole (check_model_weights of each component): checked by the roles
    that load the model, before they claim output_dir. A plan needs the configs and the tokenizer only."""
    for comp in components:
        check_model_weights(os.path.join(path, comp))


def check_model_weights(folder: str) -> None:
    """A model component (a folder with config.json) has whole safetensors weights: a missing or truncated weight
    file was a traceback after the job had claimed output_dir, and the corrected rerun was refused as another
    run. Reads the files' headers only."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return  # a tokenizer, a scheduler: no weights
    names = os.listdir(folder)
    indexes = sorted(n for n in names if n.endswith(".safetensors.index.json"))
    files = sorted(n for n in names if n.endswith(".safetensors"))
    for index in indexes:  # sharded weights: every shard it maps must be there
        try:
            mapped = set(read_json(os.path.join(folder, index))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{os.path.join(folder, index)}: not a safetensors index ({e}); restore it") from None
        gone = sorted(m for m in mapped if m not in names)
        if gone:
            raise UserError(f"{os.path.join(folder, index)} maps weights to {', '.join(gone[:3])}, which "
                            f"{'is' if len(gone) == 1 else 'are'} not in {folder}: the checkpoint is incomplete")
    if not files:
        raise UserError(f"{folder}: no weights (*.safetensors) beside its config.json: the checkpoint is "
                        f"incomplete; copy the component's weights, or save it with save_pretrained")
    for name in files:
        why = safetensors_damage(os.path.join(folder, name))
        if why:
            raise UserError(f"{os.path.join(folder, name)}: {why}; the file is damaged or was cut short (a copy "
                            f"that did not finish?): copy it again")


def safetensors_damage(path: str) -> Optional[str]:
    """Why the file is not whole safetensors, from its header alone (an 8-byte length, a JSON table of tensors
    with their byte ranges, then the data), or None."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            n = int.from_bytes(head, "little")
            if n > min(size - 8, 100 << 20):
                return f"its header claims {n} bytes, the file has {size}"
            table = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"its header does not parse ({e})"
    if not isinstance(table, dict):
        return "its header is not a table of tensors"
    ends = [t["data_offsets"][1] for k, t in table.items()
            if k != "__metadata__" and isinstance(t, dict) and isinstance(t.get("data_offsets"), list)]
    end = 8 + n + max(ends, default=0)
    if end != size:
        return f"its tensors end at byte {end}, the file has {size}"
    return None


def weight_names(folder: str) -> Optional[Set[str]]:
    """The tensor names of a component's safetensors weights, from its index or the files' headers (no tensor
    is read); None where the folder holds no readable weights (a plan may run where only the configs are)."""
    from safetensors import SafetensorError, safe_open

    if not os.path.isdir(folder):
        return None
    names = os.listdir(folder)
    indexes = sorted(n for n in names if n.endswith(".safetensors.index.json"))
    try:
        if indexes:
            return {k for index in indexes for k in read_json(os.path.join(folder, index))["weight_map"]}
        files = sorted(n for n in names if n.endswith(".safetensors"))
        found: Set[str] = set()
        for name in files:
            with safe_open(os.path.join(folder, name), framework="pt") as f:
                found.update(f.keys())
        return found or None
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):
        return None  # check_weights names a damaged checkpoint where the weights are loaded


def refuse_pickle_only(folder: str) -> None:
    names = os.listdir(folder)
    weights = [n for n in names if n.endswith(".safetensors") or n.endswith(".safetensors.index.json")]
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickles and not weights:
        raise UserError(f"{folder}: only pickle weights ({', '.join(sorted(pickles))}); bcgen loads safetensors only "
                         f"because pickle files can execute code. Convert them, e.g. "
                         f"Model.from_pretrained(..., use_safetensors=False)"
                         f".save_pretrained(DIR, safe_serialization=True) "
                         f"in a trusted environment")


def component_config(path: str, component: str) -> dict:
    return read_json(os.path.join(path, component, "config.json"))


# What a load never reads: documentation and pictures beside the weights (a model card edited in
# place changes no image). Pickle weights are never loaded either (safetensors only, above).
_NOT_LOADED = (".md", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".pdf", *PICKLE_SUFFIXES)


def weight_files(path: str) -> list:
    """The files under `path` a load can read, as sorted relative POSIX paths: weights, configs,
    tokenizer files. Hidden files and folders are left out (`.cache/huggingface/` of a download,
    `.gitattributes`), and so is what `_NOT_LOADED` names. The run identity digests these."""
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(root, path)
        for name in files:
            if not name.startswith(".") and not name.lower().endswith(_NOT_LOADED):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)
