"""Small shared builders for tests: composed configs with tiny CPU settings, prompt files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Sequence

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def compose_cfg(overrides: Sequence[str] = ()):
    """The real Hydra config, composed as the CLI would, then typed (runs every check)."""
    from hydra import compose, initialize_config_dir

    from jobs.config import register_configs, to_typed

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        raw = compose("generate", overrides=list(overrides))
    return to_typed(raw)


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prompts(n: int) -> List[dict]:
    words = "red fox quiet lake misty mountain morning light over an old stone bridge".split()
    return [{"key": f"k{i:03d}", "prompt": " ".join(words[: 1 + (i * 7) % len(words)]) + f" {i}"} for i in range(n)]


def tiny_pipeline(preset: str, *overrides: str):
    """(typed config, family, pipeline) for a tiny preset, built on the CPU in float32."""
    import torch

    from jobs.models.registry import get_family

    cfg = compose_cfg([f"model={preset}", "output_dir=/tmp/x", *overrides])
    fam = get_family(cfg.model.family)
    pipe = fam.build_tiny(cfg.model, torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return cfg, fam, pipe


def run_interpreted(script: str, timeout: int = 600) -> str:
    """`script` in a fresh interpreter with Triton's interpreter on (TRITON_INTERPRET is read when the
    kernels are defined, so never in the test process) and this checkout importable; its stdout. A failed
    script fails the test with the end of its stderr."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout
