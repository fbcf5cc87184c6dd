"""The config check both roles run first: everything about the config and environment that can be
wrong is found here, before a dataset row is read or a model is loaded.

    check = check_config(cfg)      # UserError naming the key, the value and the fix
    check.family, check.padder     # the model family and its text padder, by name
    check.output_dir               # the local folder the job writes (an object store's staging folder)
    check.divisor                  # what every image side must be a multiple of

The planner (`jobs.plan`) and the worker (`jobs.generate`) both start here; neither imports the other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from jobs.config import GenerateConfig
from jobs.errors import UserError
from jobs.hub import cached_snapshot, is_repo_id
from jobs.models.base import ModelFamily
from jobs.models.checkpoint import check_weights
from jobs.models.lora import check_loras
from jobs.models.lora_match import check_lora_targets
from jobs.models.registry import get_family
from jobs.models.scheduler import check_scheduler
from jobs.output.claim import check_writable
from jobs.output.schema import reserved_names
from jobs.output.storage import resolve
from jobs.telemetry.tensorboard import check_tensorboard
from padding import Padder, get_padder

log = logging.getLogger("jobs.preflight")


@dataclass(frozen=True)
class Checked:
    """What the check settled: the family, its padder, where output goes, the side divisor."""

    family: ModelFamily
    padder: Padder
    output_dir: Path
    divisor: int


def check_config(cfg: GenerateConfig, loads_weights: bool = True) -> Checked:
    """`loads_weights`: this role loads the model (a worker, a Ray actor), so model.path's weights must be there
    and whole; a planner (jobs.plan, the Ray driver) reads configs and the tokenizer only."""
    family = get_family(cfg.model.family)
    padder = get_padder(cfg.model.family, buckets=cfg.text_buckets, native_length=cfg.model.max_sequence_length)
    check_loras(cfg.model.loras, family.pipeline_class)
    check_scheduler(cfg.model.scheduler)
    check_tensorboard(cfg.job.tensorboard)
    _check_keep_fields(cfg.dataset.keep_fields)
    _check_model_source(cfg, family)
    if loads_weights and cfg.model.path is not None:
        check_weights(cfg.model.path, family.components)
    check_lora_targets(cfg.model.loras, family.pipeline_class, cfg.model.path)  # before the claim and the weights
    _check_text_length(cfg, family)
    divisor = family.spatial_divisor(cfg.model)
    _check_sampling(cfg, family, divisor)
    if family.video:
        from sinks.video import check_encoder_available  # imports PyAV: only for video families

        why = check_encoder_available()
        if why is not None:
            raise UserError(f"model={cfg.model.name} writes videos (KEY.mp4), but {why}")
    output = resolve(cfg.output_dir, cfg.job.staging_dir)  # an object store: its local staging folder
    check_writable(output.local)
    _check_dataset_apart(cfg.dataset.path, output.local)
    return Checked(family=family, padder=padder, output_dir=output.local, divisor=divisor)


def _check_dataset_apart(path_text: str, output_dir: Path) -> None:
    """A dataset folder that is output_dir: its first run works, then every rerun reads the run's own shards and
    parquet as prompt files (a .tar is the webdataset format), so a resume is refused as another dataset."""
    if not path_text:
        return
    folder = Path(path_text).expanduser()
    if folder.is_dir() and output_dir.exists() and folder.resolve() == output_dir.resolve():
        raise UserError(f"dataset.path={path_text!r} is the output_dir: a rerun would read the run's own shards "
                        f"and parquet as prompts. Keep the prompts in a folder of their own (or name the prompt "
                        f"files: dataset.path={str(folder / 'prompts.jsonl')!r}), or write to another output_dir")


def _check_keep_fields(names) -> None:
    clash = sorted(set(names) & reserved_names())
    if clash:
        raise UserError(f"dataset.keep_fields={list(names)!r}: {clash[0]!r} is a field every sample's json already "
                        f"has (it would be overwritten); rename that column in the dataset, or leave it out")


def _check_model_source(cfg: GenerateConfig, family: ModelFamily) -> None:
    if cfg.model.path is not None and is_repo_id(cfg.model.path):
        # Settled here, once, for every later reader (the planner's tokenizer, the loader, the identity).
        cfg.model.path = str(cached_snapshot(cfg.model.path, "model", "model.path"))
        log.info("model.path: the Hugging Face cache's snapshot %s", cfg.model.path)
    if cfg.model.path is not None:
        family.check_path(cfg.model)
    elif cfg.model.tiny is None:
        raise UserError(f"model.path is not set and preset {cfg.model.name!r} has no `tiny` section: "
                        f"pass model.path=/local/diffusers/folder")
    else:
        family.check_tiny(cfg.model)


def _check_text_length(cfg: GenerateConfig, family: ModelFamily) -> None:
    """model.max_sequence_length fits the text encoder and the pipeline (ModelFamily.text_length_limit and
    text_length_multiple). Text buckets need no check of their own: every padder drops or ignores those
    above it (padding/)."""
    n = cfg.model.max_sequence_length
    found = family.text_length_limit(cfg.model)
    if found is not None and n > found[0]:
        limit, why = found
        raise UserError(f"model.max_sequence_length={n}, but {why}; set model.max_sequence_length={limit} or less")
    multiple = family.text_length_multiple(cfg.model)
    if multiple is not None and n % multiple[0]:
        m, why = multiple
        near = sorted({max(m, n // m * m), (n // m + 1) * m})
        raise UserError(f"model.max_sequence_length={n}, but {why}; set model.max_sequence_length="
                        + " or ".join(map(str, near)))


def _check_sampling(cfg: GenerateConfig, family: ModelFamily, d: int) -> None:
    for key, v in (("sampling.height", cfg.sampling.height), ("sampling.width", cfg.sampling.width)):
        if v % d:
            raise UserError(f"{key}={v} is not a multiple of {d} ({cfg.model.name}: VAE downsampling x patch size, "
                            f"and what its pipeline accepts); "
                            f"use {max(d, round(v / d) * d)}")
    why = family.frames_error(cfg.model, cfg.sampling.num_frames)
    if why is not None:
        raise UserError(f"sampling.{why}")
    if cfg.sampling.steps < family.min_steps:
        raise UserError(f"sampling.steps={cfg.sampling.steps}, but {cfg.model.name}'s scheduler takes at least "
                        f"{family.min_steps} steps; set sampling.steps={family.min_steps} or more")
    if family.fixed_fps is not None and cfg.sampling.fps != family.fixed_fps:
        raise UserError(f"sampling.fps={cfg.sampling.fps:g}, but {family.pipeline_class} makes "
                        f"{family.fixed_fps:g} fps only; set sampling.fps={family.fixed_fps:g}")
    if not family.guidance and cfg.sampling.guidance_scale > 1.0:
        raise UserError(f"sampling.guidance_scale={cfg.sampling.guidance_scale:g}, but {cfg.model.name} is "
                        f"guidance-distilled (no negative branch); set sampling.guidance_scale=1.0")
