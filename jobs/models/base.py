"""What a model family provides to the job: load, plan text lengths, encode, denoise + decode.

A family adapts one diffusers pipeline class. The job drives the pipeline from outside, in three
stages it can overlap (jobs/worker/scheduler.py): `encode` prompts (so the family's padder can re-bucket the
embeddings), `denoise` by handing the padded embeddings back to the pipeline's own `__call__`
(whose denoising loop calls the transformer that the bcg runner has wrapped), and `decode` the
latents with the pipeline's VAE. Nothing here knows about graphs or streams.

The planner imports every family for its plan-side rules (text lengths, side divisor, frame
rule, tokenizer) and runs no tensor op, so a family module imports torch, diffusers and
transformers inside the methods that build or run the model, never at module level
(tests/test_plan_imports.py): planning 1,000 prompts should not pay a second for `import torch`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from jobs.config import ModelConfig
from jobs.errors import UserError
from jobs.models.lora import apply_loras, check_loras
from jobs.models.scheduler import apply_scheduler
from padding import TextEmbeds

if TYPE_CHECKING:
    import torch


@dataclass
class TextLength:
    """A prompt's text length as the pipeline will see it, from the tokenizer alone."""

    used: int  # positions up to the last real token after the pipeline's own truncation
    raw: int  # tokens before truncation (raw > limit means the prompt was truncated)
    limit: int  # the pipeline's native text length

    @property
    def truncated(self) -> bool:
        return self.raw > self.limit


@dataclass
class RowInputs:
    """What a family makes per row in the encode stage beside the text (GLM-Image: its AR prior's
    tokens), so that work overlaps the previous batch's denoising (jobs/worker/scheduler.py)."""

    tensors: Dict[str, torch.Tensor]  # batch-first, on the device
    meta: List[dict]  # per-row json fields that record them (one dict per row)

    def rows(self, a: int, b: int) -> "RowInputs":
        """Rows a..b (the halves of an out-of-memory split)."""
        return RowInputs(tensors={k: v[a:b] for k, v in self.tensors.items()}, meta=self.meta[a:b])


@dataclass
class DenoiseRequest:
    """One batch, all items of one signature (same size, steps, guidance, text bucket)."""

    positive: TextEmbeds
    negative: Optional[TextEmbeds]  # None when CFG is off
    seeds: List[int]
    height: int
    width: int
    steps: int
    guidance_scale: float
    num_frames: int = 1  # 1: an image; video families decode [B, F, 3, H, W]
    fps: float = 16.0  # the items' frame rate; only a family with `fps_conditions` feeds it to its model
    prompts: List[str] = field(default_factory=list)  # the rows' prompts (GLM-Image's prior reads the text)
    row_inputs: Optional[RowInputs] = None  # the encode stage's `ModelFamily.row_inputs`, where the family has any
    meta: List[dict] = field(default_factory=list)
    """Per-item json fields (GLM-Image: its prior tokens' digest): empty, or one dict per row of the
    batch. Host-side facts only; the engine copies them from `row_inputs`."""


@dataclass
class Decoded:
    """What a family's `decode` gives where it makes more than pixels (LTX-2: a soundtrack)."""

    images: torch.Tensor  # [B, 3, H, W] or [B, F, 3, H, W] in [0, 1], as `decode` returns them
    audio: Optional[torch.Tensor] = None  # [B, C, N] float waveforms in [-1, 1], on the device
    sample_rate: int = 0  # Hz of `audio`


class ModelFamily:
    """Subclasses implement one diffusers pipeline family."""

    name: str = ""
    pipeline_class: str = ""  # diffusers class name expected in model_index.json
    components: tuple = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")  # its subfolders

    def check_path(self, cfg: ModelConfig) -> None:
        """model.path is a diffusers folder of this pipeline with safetensors weights (no load yet)."""
        from jobs.models.checkpoint import check_diffusers_folder

        assert cfg.path is not None  # preflight checks a path only where model.path is set
        check_diffusers_folder(cfg.path, self.pipeline_class, self.components)

    def check_tiny(self, cfg: ModelConfig) -> None:
        """The tiny section is one this family can build (no model is loaded). Only SANA's tiny
        preset has trained weights; the others build seeded random ones."""
        from jobs.models import demo_weights

        assert cfg.tiny is not None  # preflight checks the tiny section only where there is one
        if demo_weights.mode(cfg.tiny) == demo_weights.TRAINED:
            raise UserError(f"model.tiny.weights=trained: {cfg.name} has no trained weights (only sana_tiny does); "
                            f"use model.tiny.weights=random")

    def build_tiny(self, cfg: ModelConfig, dtype: torch.dtype):
        """A pipeline of tiny components (the real classes; seeded random weights, or sana_tiny's
        trained demo weights), for CPU runs and tests.

        Subclasses end with `return self.prepare_tiny(pipe, cfg, dtype)` (or `self.prepare(pipe, cfg)`
        where they cast the components themselves)."""
        raise NotImplementedError

    def prepare_tiny(self, pipe, cfg: ModelConfig, dtype: torch.dtype):
        """A tiny pipeline, built in float32, cast to `dtype` only when asked (ModelMixin.to warns on
        every cast), then `prepare`d."""
        import torch

        return self.prepare(pipe if dtype == torch.float32 else pipe.to(dtype=dtype), cfg)

    def load(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu"):
        """The real pipeline from a local diffusers folder, offline, safetensors only.

        `device` is where the job will run it: for the CPU the weights are copied out of the
        checkpoint's file mapping here (jobs/models/weights.py says why).
        """
        from jobs.models.weights import own_weights

        check_loras(cfg.loras, self.pipeline_class)  # a bad LoRA fails before the weights load
        pipe = self.from_pretrained(cfg, dtype)
        own_weights(pipe, device)  # before the LoRAs fuse: they then add into owned memory
        return self.prepare(pipe, cfg)

    def save(self, pipe, path) -> None:
        """Write `pipe` as a folder `load` reads (tests save a tiny pipeline and load it as the real preset)."""
        pipe.save_pretrained(path, safe_serialization=True)

    def import_pipeline(self) -> None:
        """Import the pipeline's class: diffusers imports it lazily on first use, and with it
        transformers and the text encoder's modelling code. Called first by the job's load, so that
        summary.json's `load_seconds` shows the imports apart from the weights (several seconds of a
        SANA-1.6B load on the H200, `benchmarks/results/job_load_spy_h200_s45.md`)."""
        import diffusers

        getattr(diffusers, self.pipeline_class, None)  # None where diffusers has no such class: load says so

    def from_pretrained(self, cfg: ModelConfig, dtype: torch.dtype, **components):
        import diffusers

        cls = getattr(diffusers, self.pipeline_class)
        return cls.from_pretrained(cfg.path, dtype=dtype, local_files_only=True, use_safetensors=True,
                                   **components)

    def prepare(self, pipe, cfg: ModelConfig):
        """What every pipeline, tiny or loaded, goes through before the job runs it (and before
        the bcg runner wraps its transformer)."""
        from jobs.models.weights import eval_mode, forward_only

        apply_loras(pipe, cfg.loras, self.pipeline_class)
        apply_scheduler(pipe, cfg.scheduler)
        eval_mode(pipe)
        forward_only(pipe, self.forward_only_encoders)
        self.patch(pipe)
        return pipe

    #: text encoders the pipeline runs forward once for hidden states: their KV cache is turned off
    #: (jobs/models/weights.py says why). Not a model that generates tokens (GLM-Image's AR model).
    forward_only_encoders: Tuple[str, ...] = ("text_encoder",)

    def patch(self, pipe) -> None:
        """The family's host-side fixes to a pipeline instance (none by default)."""

    #: the tokenizer that decides the text length the transformer sees: its checkpoint subfolder,
    #: and the key of its spec in a tiny preset's `tiny:` section
    tokenizer_folder: str = "tokenizer"
    tiny_tokenizer_key: str = "text_encoder"

    def load_tokenizer(self, cfg: ModelConfig):
        """For planning: the tokenizer alone, before (and without) any weights."""
        if cfg.path is None:
            from jobs.models.tiny import tiny_tokenizer

            return tiny_tokenizer(getattr(cfg.tiny, self.tiny_tokenizer_key))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.join(cfg.path, self.tokenizer_folder), local_files_only=True)

    def component_config(self, cfg: ModelConfig, name: str) -> dict:
        """A component's config: the tiny preset's section, or the checkpoint's config.json (no weights)."""
        from jobs.models.checkpoint import component_config

        return getattr(cfg.tiny, name) if cfg.path is None else component_config(cfg.path, name)

    def text_length_limit(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        """The largest model.max_sequence_length this model can run, and what sets it (said after
        "model.max_sequence_length=N, but"), from configs alone: the config check refuses a larger one
        before any weight loads (it failed after the load, or cut prompts silently). None where nothing
        sets one: relative (T5) and rotary (Gemma, Qwen) text positions run at any length."""
        return None

    def text_length_multiple(self, cfg: ModelConfig) -> Optional[Tuple[int, str]]:
        """A number model.max_sequence_length must be a multiple of, and what sets it (said after
        "model.max_sequence_length=N, but"), from configs alone. None where any length runs."""
        return None

    def text_lengths(self, tokenizer, prompts: Sequence[str], cfg: ModelConfig, instruction: bool) -> List[TextLength]:
        raise NotImplementedError

    def text_length_arrays(self, tokenizer, prompts, cfg: ModelConfig, instruction: bool):
        """`text_lengths` over an Arrow string array, as int64 arrays (used, raw, limit): the
        planner's form. A family may answer it without a Python object per prompt (sana.py);
        the answer must equal text_lengths'."""
        out = self.text_lengths(tokenizer, prompts.to_pylist(), cfg, instruction)
        return tuple(np.fromiter((getattr(t, f) for t in out), np.int64, count=len(out))
                     for f in ("used", "raw", "limit"))

    def spatial_divisor(self, cfg: ModelConfig) -> int:
        """Pixel sizes must be multiples of this (VAE downsampling x patch size)."""
        raise NotImplementedError

    #: True where the family makes videos: `decode` then gives [B, F, 3, H, W] and items of more
    #: than one frame are written as KEY.mp4
    video: bool = False
    #: True where the denoiser conditions on the frame rate (LTX-2: its rotary time coordinates and
    #: the audio length follow it). A pipeline call takes one rate, so every item of such a job
    #: plays at `sampling.fps`: the plan refuses rows that ask for another (jobs/plan/resolve.py).
    fps_conditions: bool = False
    #: the one frame rate the model makes (MiniMax-H3: 24), or None; the config check refuses another
    fixed_fps: Optional[float] = None
    #: False where the checkpoint is guidance-distilled (no negative branch): guidance_scale > 1 is
    #: refused in the config and in dataset rows, rather than silently ignored
    guidance: bool = True
    #: the fewest denoising steps its scheduler takes (MiniMax-H3's needs 2): the config check and
    #: the plan refuse fewer, and batch sizing times its probes at this many steps and more
    min_steps: int = 1

    def frames_error(self, cfg: ModelConfig, n: int) -> Optional[str]:
        """None where the family makes `n` frames per item; else why not and what to use instead,
        as "num_frames=N ..." (the plan prefixes file:line, the config check `sampling.`)."""
        if n == 1:
            return None
        return (f"num_frames={n}, but {self.pipeline_class} makes images (one frame each); drop num_frames "
                f"(or set it to 1), or pick a video model, e.g. model=wan or model=sana_video")

    def transformer(self, pipe) -> torch.nn.Module:
        return pipe.transformer

    def encode(self, pipe, prompts: Sequence[str], cfg: ModelConfig, device, instruction: bool) -> TextEmbeds:
        raise NotImplementedError

    def row_inputs(self, pipe, prompts: Sequence[str], seeds: Sequence[int], height: int, width: int,
                   device) -> Optional[RowInputs]:
        """Per-row inputs beside the text, made in the encode stage (on the encode stream, seeded from
        each row so a row's inputs do not depend on its batch); None where the family has none."""
        return None

    # -- denoise and decode: the stages the job schedules --------------------------------------
    def pipeline_kwargs(self, request: DenoiseRequest) -> dict:
        """The pipeline call for one batch (everything but output_type and return_dict)."""
        raise NotImplementedError

    #: what `denoise` asks the pipeline for: "latent" where the family decodes in `decode` (the
    #: decode then overlaps the next batch's denoising), else "pt" (the pipeline decodes itself)
    denoise_output: str = "pt"

    def denoise(self, pipe, request: DenoiseRequest) -> torch.Tensor:
        """Run the denoising loop on the current stream; no host sync after the loop's start.

        Returns latents (denoise_output "latent") or images [B, 3, H, W] in [0, 1] ("pt"; a video
        family's [B, F, 3, H, W])."""
        return pipe(**self.pipeline_kwargs(request), output_type=self.denoise_output, return_dict=False)[0]

    def decode(self, pipe, latents, request: DenoiseRequest) -> "torch.Tensor | Decoded":
        """Latents -> images [B, 3, H, W] (a video family: [B, F, 3, H, W]) in [0, 1], on the device,
        exactly as the pipeline's own decode + postprocess(output_type="pt") gives them. Identity
        where `denoise` decoded. A family that makes more than pixels returns a `Decoded`.
        `latents` is whatever `denoise` returned: a tensor, or a tuple of tensors."""
        assert self.denoise_output == "pt", f"{type(self).__name__} returns latents but has no decode()"
        return latents

    def warmup_latents(self, pipe, size: int, height: int, width: int, num_frames: int, device,
                       generator: torch.Generator) -> Optional[torch.Tensor]:
        """Random latents as `denoise` returns them for a batch of `size` at this size, for a decode
        whose outputs are thrown away (jobs/worker/pipeline.py `warm_decode`: a shape's first decode pays
        its convolutions' set-up on the host); None where the family offers none (no warm-up)."""
        return None

    def denoise_decode(self, pipe, request: DenoiseRequest) -> np.ndarray:
        """The serial reference path: the pipeline's own call, decoded to float32 [B, H, W, 3] (a video
        family: [B, F, H, W, 3]) in [0, 1] on the host (NaN/Inf passed through). Tests compare the
        staged path against it."""
        images = pipe(**self.pipeline_kwargs(request), output_type="np", return_dict=False)[0]
        return np.asarray(images, dtype=np.float32)

def cpu_generators(seeds: Sequence[int]) -> List[torch.Generator]:
    # CPU generators: the same seed gives the same noise on any machine and in any batch.
    import torch

    return [torch.Generator("cpu").manual_seed(int(s)) for s in seeds]
