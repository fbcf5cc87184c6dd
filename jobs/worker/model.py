"""The model a worker runs: the device, the loaded diffusers pipeline, its transformer wrapped
by the graph runner (bcg/) at the configured quality tier, and the kernels it all runs on
(`bcg.invariant`: the batch-invariant ones).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional

import torch

from bcg import GraphRunner, apply_graph_runner
from bcg.breaks import unknown_names
from bcg.config import POLICIES, BreakPolicy
from bcg.invariant import BatchInvariance, batch_invariant
from bcg.prewarm import start_triton_key
from bcg.rewrites import Rewrite, rewrite_for
from jobs.config import GenerateConfig
from jobs.errors import UserError
from jobs.models.base import ModelFamily
from jobs.telemetry.summary import StageTimer

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


def load_pipeline(family: ModelFamily, cfg: GenerateConfig, device: torch.device, parts: Optional[StageTimer] = None):
    """The pipeline on `device`, its parts timed into `parts` (summary.json's `load_seconds`): the
    imports, the weights (from_pretrained or the tiny build, and the family's preparation), the copy
    to the device."""
    parts = parts if parts is not None else StageTimer()
    dtype = torch_dtype(cfg.model.dtype)
    t0 = time.perf_counter()
    with parts("imports"):
        if device.type == "cuda":
            start_triton_key()  # Triton imported here, its cache key hashed beside the imports (bcg/prewarm.py)
        family.import_pipeline()
    with parts("weights"):
        pipe = family.build_tiny(cfg.model, dtype) if cfg.model.path is None else family.load(cfg.model, dtype,
                                                                                                device)
    with parts("to_device"):
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


def attach_decoder_fusions(pipe, cfg: GenerateConfig, device: torch.device) -> Optional[Rewrite]:
    """The lossless tier's rewrites on the pipeline's VAE as well (bcg.decoder_fusions): only rules whose
    blocks it has apply (bcg/fusions/dc_ae.py: SANA's DC-AE), each chain and each rewritten block verified
    bit for bit against eager on first sight. The decode runs no graph, so this is the rewrite alone.
    None where the knob, the tier or the device says no, or no rule applies."""
    vae = getattr(pipe, "vae", None)
    if vae is None or not (cfg.bcg.enabled and cfg.bcg.decoder_fusions and cfg.bcg.tier == "lossless"
                           and device.type == "cuda"):
        return None
    install = rewrite_for("lossless")
    fused = install(vae) if install is not None else None
    if fused is None or not fused.stats().get("modules"):
        if fused is not None:
            fused.remove()
        return None
    log.info("bcg.decoder_fusions: %d %s block(s) of the VAE fused", fused.stats()["modules"], type(vae).__name__)
    return fused


def batch_invariance(cfg: GenerateConfig, device: torch.device,
                     ) -> "contextlib.AbstractContextManager[Optional[BatchInvariance]]":
    """`with batch_invariance(cfg, device) as inv:` the batch-invariant kernels (bcg.invariant; null:
    on with CUDA), installed for the whole worker process until the block ends, or nothing (inv is
    None) where the mode is off.

    Entered before the model loads: a row's text embedding and its decode must not depend on its batch
    any more than its denoising, and graphs must capture the replacement kernels. Process-wide
    (torch.library registrations), so the prefetch (encode) thread and the decode stream's work run
    under it too."""
    return batch_invariant() if cfg.bcg.invariant_on(device.type) else contextlib.nullcontext()


def invariance_report(inv: Optional[BatchInvariance]) -> dict:
    """summary.json's `invariant`: whether the mode ran, on which devices, and its kernels' call counts.
    A `.fallback` count is a call the mode handed back to aten (a dtype it does not cover): the
    contract may not hold for the rows it computed, so it is logged as a warning too."""
    if inv is None:
        return {"enabled": False}
    stats = dict(inv.stats(), enabled=True)
    fallbacks = {op: n for op, n in stats["calls"].items() if op.endswith(".fallback")}
    if fallbacks:
        log.warning("bcg.invariant: %d call(s) fell back to aten's batch-variant kernels (%s): rows they computed "
                    "may depend on their batch", sum(fallbacks.values()), ", ".join(sorted(fallbacks)))
    return stats
