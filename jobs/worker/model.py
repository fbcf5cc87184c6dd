"""The model a worker runs: the device, the loaded diffusers pipeline, and its transformer wrapped
by the graph runner (bcg/) at the configured quality tier.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from bcg import GraphRunner, apply_graph_runner
from bcg.breaks import unknown_names
from bcg.config import POLICIES, BreakPolicy
from jobs.config import GenerateConfig
from jobs.errors import UserError
from jobs.models.base import ModelFamily

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device=cuda but no CUDA device is visible here (torch.cuda.is_available() is False); "
                        "use device=auto or device=cpu, or run on a machine with a GPU and a CUDA build of torch")
    return torch.device(name)


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_pipeline(family: ModelFamily, cfg: GenerateConfig, device: torch.device):
    dtype = torch_dtype(cfg.model.dtype)
    t0 = time.perf_counter()
    pipe = family.build_tiny(cfg.model, dtype) if cfg.model.path is None else family.load(cfg.model, dtype, device)
    pipe = pipe.to(device)
    pipe.set_progress_bar_config(disable=True)  # the job shows one bar of its own
    log.info("loaded %s (%s, %s) on %s in %.1fs", cfg.model.name, family.pipeline_class, cfg.model.dtype, device,
             time.perf_counter() - t0)
    return pipe


def break_policy(names) -> BreakPolicy:
    """model.break_policy is a list in the config ([none], [attention] or module names)."""
    names = list(names)
    return names[0] if len(names) == 1 and names[0] in POLICIES else names


def attach_runner(family: ModelFamily, pipe, cfg: GenerateConfig) -> Optional[GraphRunner]:
    """Wrap the transformer with the bcg runner, configured by the `bcg` group itself (it steps
    aside, eager, without CUDA); None with bcg.enabled=false."""
    if not cfg.bcg.enabled:
        log.info("bcg.enabled=false: every denoiser call runs eager")
        return None
    policy = break_policy(cfg.model.break_policy)
    if isinstance(policy, list):  # names can only be checked against the loaded model
        problem = unknown_names(family.transformer(pipe), policy)
        if problem:
            raise UserError(f"model.{problem[len('bcg.'):]} (preset {cfg.model.name})")
    return apply_graph_runner(family.transformer(pipe), cfg.bcg, break_policy=policy)
