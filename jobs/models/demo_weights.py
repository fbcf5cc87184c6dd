"""The trained weights of the sana_tiny demo model (jobs/data/demo/), and what may load them.

`model.tiny.weights`: `trained` loads the shipped transformer and VAE (float16 safetensors,
converted to the module's dtype on load: a copy, so the same file gives the same weights
everywhere); `random` keeps the seeded random init. The shipped weights fit one architecture:
the one config.json beside them records. A preset whose `tiny.transformer` or `tiny.vae` differs is
refused before any model loads, naming the first keys that differ. A tiny section without a
`weights` key (every other tiny preset) is random.

The run identity carries the files' sha256, so outputs of other weights never mix in one folder.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from jobs.config import TinyConfig
from jobs.errors import UserError

if TYPE_CHECKING:  # torch loads with the model, not with the planner that reads identity()
    import torch

DEMO_DIR = Path(__file__).resolve().parents[1] / "data" / "demo"
CONFIG = "config.json"
FILES = {"transformer": "transformer.safetensors", "vae": "vae.safetensors"}
TRAINED, RANDOM = "trained", "random"
CHOICES = (TRAINED, RANDOM)
#: the sections a SANA tiny preset may set (another family's, such as `clip`, would be ignored)
SANA_TINY_KEYS = ("seed", "weights", "text_encoder", "text_encoder_weights", "transformer", "vae", "scheduler")


def mode(tiny: TinyConfig) -> str:
    return str(tiny.weights) if tiny.weights is not None else RANDOM


@lru_cache(maxsize=1)
def trained_config() -> dict:
    path = DEMO_DIR / CONFIG
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the demo weights' config ({e}); reinstall bcgen, or use "
                        f"model.tiny.weights=random") from None


def _differences(prefix: str, want, got) -> list:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            out += _differences(f"{prefix}.{k}", want.get(k, "<absent>"), got.get(k, "<absent>"))
        return out
    def norm(v: Any) -> Any:
        return [norm(x) for x in v] if isinstance(v, (list, tuple)) else v

    return [] if norm(want) == norm(got) else [f"{prefix}={got!r} (the trained weights have {want!r})"]


def check_sana_tiny(tiny: TinyConfig) -> None:
    """For SANA's tiny preset: its sections only, and with trained weights the trained architecture."""
    unknown = sorted(set(tiny.identity()) - set(SANA_TINY_KEYS))
    if unknown:
        raise UserError(f"model.tiny.{unknown[0]} is not a key of a SANA tiny preset; known keys: "
                        f"{', '.join(SANA_TINY_KEYS)}. Remove it, or fix its spelling")
    if mode(tiny) != TRAINED:
        return
    trained = trained_config()
    diffs = []
    for component in FILES:
        diffs += _differences(f"model.tiny.{component}", trained[component], dict(getattr(tiny, component)))
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise UserError(f"{shown}: the trained demo weights (jobs/data/demo/) fit only the architecture they were "
                        f"trained with; restore it, or pass model.tiny.weights=random to build this one with random "
                        f"weights")


def load(component: str, module: torch.nn.Module) -> None:
    """Copy the shipped weights into `module` (strict: every key, every shape)."""
    import torch
    from safetensors.torch import load_file

    state = load_file(str(DEMO_DIR / FILES[component]))
    with torch.no_grad():
        module.load_state_dict(state, strict=True)  # copy_: float16 -> the module's dtype, exactly


@lru_cache(maxsize=1)
def digest() -> str:
    h = hashlib.sha256()
    for name in sorted(FILES.values()) + [CONFIG]:
        h.update(name.encode())
        h.update((DEMO_DIR / name).read_bytes())
    return h.hexdigest()


def identity(tiny: Optional[TinyConfig], path) -> dict:
    """The run-identity entry: the weight files' digest when a tiny preset loads trained weights."""
    if path is not None or tiny is None or mode(tiny) != TRAINED:
        return {}
    return {"tiny_weights_sha256": digest()}
