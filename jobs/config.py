"""Typed configuration for `python -m jobs.generate`.

One dataclass per config group, every field with a default and a docstring. The same classes are
registered with Hydra's ConfigStore as schemas, so a typo (`sampling.stpes=4`) fails at compose
time, and `to_typed()` turns the composed DictConfig into these dataclasses, which runs every
`__post_init__` check before anything heavy is imported or loaded.

OmegaConf 2.3 rejects `typing.Literal`, so choices are plain `str` fields validated against a
tuple of allowed values; the error names the key, the value and the allowed ones.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, cast, overload

from bcg.config import RunnerConfig
from jobs.dataset import DatasetConfig
from jobs.dataset.rules import MAX_FPS, MAX_FRAMES, MAX_SIDE, MAX_STEPS
from jobs.errors import UserError
from sinks.config import SinkConfig

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
LONG_PROMPT = ("truncate", "fail")
NONFINITE = ("record", "ledger")
CAPTURE_POLICIES = ("auto", "always")
VERIFY = ("members", "full")
TINY_WEIGHTS = ("trained", "random")  # jobs/models/demo_weights.py
MAX_IMAGES_PER_PROMPT = 10000  # samples a row: more is a typo (a sweep of seeds belongs in the dataset)
MAX_BATCH = 1024  # a short batch is padded up to a pool size: a huge one is an out-of-memory typo
MAX_TTL_S = 7 * 86400.0  # job.lease_ttl_s: finite, or no lease ever expires (and the heartbeat cannot wait ttl/4)
MAX_PLAN_WORKERS = 1024


def check_choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


@overload
def home(path: str) -> str: ...
@overload
def home(path: None) -> None: ...
@overload
def home(path: Optional[str]) -> Optional[str]: ...


def home(path: Optional[str]) -> Optional[str]:
    """`~/x` -> `/home/me/x`: a path quoted past the shell (`'output_dir=~/x'`) or set in a yaml file
    keeps its `~`, and a folder literally named `~` is never what was meant. URLs are left alone."""
    if path is None or "://" in str(path):
        return path
    return os.path.expanduser(str(path))


def check(key: str, ok: bool, value: Any, expected: str) -> None:
    if not ok:
        raise UserError(f"{key}={value!r} is invalid: expected {expected}")


@dataclass
class LoraConfig:
    """One LoRA adapter, fused into the weights at load (jobs/models/lora.py)."""

    path: str = ""
    """Local LoRA file (.safetensors) that the pipeline's diffusers `load_lora_weights` reads."""
    scale: float = 1.0
    """Strength it is fused at (diffusers' `fuse_lora(lora_scale=...)`); 0 < |scale|, finite."""

    def __post_init__(self) -> None:
        self.path = home(self.path)
        check("model.loras[].path", bool(str(self.path).strip()), self.path, "a local .safetensors file")
        check("model.loras[].scale", math.isfinite(self.scale) and self.scale != 0, self.scale,
              "a finite non-zero number (leave the LoRA out to disable it)")


@dataclass
class TinyConfig:
    """`model.tiny`: a preset built from configs instead of a checkpoint (model.path=None): the
    seed of its random weights and one config section per component (conf/model/*_tiny.yaml).
    Which sections a family reads is the family's (jobs/models/); a section it needs and lacks is
    refused when the pipeline is built."""

    seed: int = 0
    """Seed of the random weights: the same preset gives the same weights everywhere."""
    weights: Optional[str] = None
    """trained (sana_tiny's demo weights, jobs/data/demo/) | random; None means random."""
    transformer: Dict[str, Any] = field(default_factory=dict)
    vae: Dict[str, Any] = field(default_factory=dict)
    scheduler: Dict[str, Any] = field(default_factory=dict)
    text_encoder: Any = None
    """A text-encoder spec (a dict), or for SANA `minilm` / a local transformers folder."""
    text_encoder_weights: Optional[str] = None
    """SANA: pretrained (the MiniLM package's) | random; None means pretrained."""
    clip: Optional[Dict[str, Any]] = None  # Flux's first text encoder
    t5: Optional[Dict[str, Any]] = None  # Flux's second text encoder
    vision_language_encoder: Optional[Dict[str, Any]] = None  # GLM-Image's autoregressive prior
    connectors: Optional[Dict[str, Any]] = None  # LTX-2's text connectors
    audio_vae: Optional[Dict[str, Any]] = None  # LTX-2, MiniMax-H3
    vocoder: Optional[Dict[str, Any]] = None  # LTX-2
    audio_scheduler: Optional[Dict[str, Any]] = None  # MiniMax-H3

    def __post_init__(self) -> None:
        if self.weights is not None:
            check_choice("model.tiny.weights", self.weights, TINY_WEIGHTS)

    def identity(self) -> Dict[str, Any]:
        """The sections set, as the run identity records them (unset ones are left out)."""
        from dataclasses import asdict

        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class ModelConfig:
    name: str = "sana_tiny"
    """Preset name (the file under conf/model/); used in metadata and the default output_dir."""
    family: str = "sana"
    """Model family: selects the loader (jobs/models/) and the padding policy (padding/)."""
    path: Optional[str] = None
    """Local diffusers folder (model_index.json + subfolders), or a Hub id (`org/name`) whose snapshot
    the local Hugging Face cache holds (never downloaded). None: build `tiny` from config."""
    dtype: str = "float32"
    """Weights and activations dtype: float32 | bfloat16 | float16."""
    max_sequence_length: int = 300
    """Text length the pipeline encodes to natively (SANA: 300). Longer prompts are truncated."""
    text_buckets: List[int] = field(default_factory=lambda: [64, 128, 256, 512, 1024])
    """Padded text lengths that share graphs; buckets above max_sequence_length are dropped."""
    break_policy: List[str] = field(default_factory=lambda: ["none"])
    """Graph breaks: ["none"] (one segment), ["attention"], or module names / class names."""
    complex_human_instruction: Optional[List[str]] = None
    """SANA's instruction prefix for prompts; None disables it (the tiny presets)."""
    on_long_prompt: str = "truncate"
    """A prompt longer than max_sequence_length: truncate (counted in the summary) | fail."""
    tiny: Optional[TinyConfig] = None
    """For path=None: the seed and configs of the tiny components (TinyConfig; conf/model/*_tiny.yaml)."""
    scheduler: Optional[str] = None
    """A diffusers scheduler class to denoise with instead of the checkpoint's, built from the
    checkpoint's scheduler config (`Class.from_config`), e.g. DPMSolverMultistepScheduler; None:
    the checkpoint's own. Part of the run identity."""
    loras: List[LoraConfig] = field(default_factory=list)
    """LoRAs fused into the weights in order before the graph runner wraps the transformer, e.g.
    `model.loras=[{path:/loras/style.safetensors,scale:0.8}]`. Part of the run identity."""

    def __post_init__(self) -> None:
        self.path = home(self.path)
        check_choice("model.dtype", self.dtype, DTYPES)
        check_choice("model.on_long_prompt", self.on_long_prompt, LONG_PROMPT)
        check("model.max_sequence_length", self.max_sequence_length > 0, self.max_sequence_length, "a positive int")
        check("model.text_buckets", len(self.text_buckets) > 0, list(self.text_buckets),
              "a non-empty list of positive ints, e.g. [64,128,256]")
        check("model.text_buckets", all(int(b) > 0 for b in self.text_buckets), list(self.text_buckets),
              "positive ints")
        names = [str(n) for n in self.break_policy]
        check("model.break_policy", len(names) > 0 and all(names), names,
              '["none"], ["attention"] or a list of module names / class names')
        check("model.break_policy", len(names) == 1 or not {"none", "attention"} & set(names), names,
              '"none" and "attention" alone (["none"] or ["attention"]), or a list of module names without them')


@dataclass
class SamplingConfig:
    steps: int = 20
    """Denoising steps (a dataset row's `steps` overrides it)."""
    guidance_scale: float = 4.5
    """Classifier-free guidance scale; <= 1 disables CFG (no negative branch)."""
    height: int = 1024
    """Image height in pixels (a row's `height` overrides it)."""
    width: int = 1024
    """Image width in pixels (a row's `width` overrides it)."""
    seed: int = 0
    """Job seed: an item without its own seed gets one derived from (job seed, key)."""
    negative_prompt: str = ""
    """Negative prompt for rows that give none (used only with CFG)."""
    num_frames: int = 1
    """Frames per item: 1 is an image; a video family's preset sets its own default (Wan: 81, which
    is 4k+1 for its VAE). A row's `num_frames` overrides it; the family refuses counts it cannot make."""
    fps: float = 16.0
    """Playback rate written into each video (KEY.mp4 and its json); a row's `fps` overrides it."""
    images_per_prompt: int = 1
    """Samples a row makes (diffusers' num_images_per_prompt): N > 1 gives keys `KEY-0` .. `KEY-{N-1}`,
    each with its own seed (a row's `seed` s gives s, s+1, ...; otherwise derived from the sample's key)."""

    def __post_init__(self) -> None:
        # The limits dataset rows have: a value a row may not carry is no better as a default.
        check("sampling.steps", 0 < self.steps <= MAX_STEPS, self.steps, f"an int in [1, {MAX_STEPS}]")
        check("sampling.guidance_scale", math.isfinite(self.guidance_scale) and self.guidance_scale >= 0,
              self.guidance_scale, "a finite number >= 0")
        check("sampling.height", 0 < self.height <= MAX_SIDE, self.height, f"an int in [1, {MAX_SIDE}]")
        check("sampling.width", 0 < self.width <= MAX_SIDE, self.width, f"an int in [1, {MAX_SIDE}]")
        check("sampling.seed", 0 <= self.seed < 2**63, self.seed, "an int in [0, 2**63)")
        check("sampling.num_frames", 0 < self.num_frames <= MAX_FRAMES, self.num_frames,
              f"an int in [1, {MAX_FRAMES}] (1: an image)")
        check("sampling.fps", math.isfinite(self.fps) and 0 < self.fps <= MAX_FPS, self.fps,
              f"a number in (0, {MAX_FPS:g}], e.g. 16 or 24")
        check("sampling.images_per_prompt", 0 < self.images_per_prompt <= MAX_IMAGES_PER_PROMPT,
              self.images_per_prompt, f"an int in [1, {MAX_IMAGES_PER_PROMPT}]")


@dataclass
class BcgConfig(RunnerConfig):
    """The `bcg` group: the graph runner's own knobs (inherited from bcg's `RunnerConfig`, checked
    there: enabled, backend, warmup_iters, warmup, max_graphs, max_graph_memory_gb, debug_check_buffers,
    fusions, compile) and what the job decides around the runner."""

    warmup: str = "live"
    """The runner's `warmup` (bcg/config.py), "live" here: a signature's first `warmup_iters`
    denoiser calls of its first batch run eager and the next one captures, so a capture computes
    nothing twice. At SANA-1.6B size, 1024², a job captures once a signature (4 in 1,000 prompts),
    each time two forwards of about 0.1 s that "random" spends on random inputs."""
    batch_sizes: List[int] = field(default_factory=lambda: [8])
    """Graph pool batch sizes: each signature's items are cut into batches of these sizes, a short
    tail padded up to the smallest (pad_short_batches). One size by default, so every batch of an
    image job has one shape and a sample's bytes do not depend on its neighbours, its position, the
    partition or a resume (issue 30). On the H200 at SANA-1.6B size, 512², 200 prompts it cost
    nothing over the wall clock against the old default [1, 2, 4, 8] (5.43 against 4.93 images/s,
    medians of 3, benchmarks/results/job_wall_h200_512_contract_s31.md); what it costs is a job of
    fewer than 8 prompts a signature, which denoises 8 rows. Z-Image and the video presets set [1]
    (conf/model/wan.yaml: a single video would otherwise denoise 8, and at real size a video costs the
    same at batch 1 and 2)."""
    text_buckets: Optional[List[int]] = None
    """Override of model.text_buckets (None: use the model's)."""
    warmup_resolutions: List[List[int]] = field(default_factory=list)
    """[[h, w], ...] allowed for capture; [] = every resolution the plan needs. Others run eager."""
    pad_short_batches: bool = True
    """A batch smaller than every pool size is padded with dummy rows (discarded) to a captured size."""
    capture: str = "always"
    """always (the default): capture every capturable (signature, batch size) on its first batch;
    auto: capture one only when its remaining batches pay for the capture, measured on an eager
    batch first (jobs/worker/dispatcher.py). On the H200 at SANA-1.6B size, 512², 200 prompts,
    always made 4.99 images/s over the wall clock against auto's 4.52 (medians of 3, same call,
    benchmarks/results/job_wall_h200_512_s28.md): the fused path's eager batches are host-bound,
    and a capture with fusions costs about 0.2 s."""
    capture_min_gain: float = 0.02
    """auto: release a key's graphs when replay is not this fraction faster than eager."""
    batch_grow: str = "off"
    """Grow the pool past its largest size (x2, x4, ...) while memory allows and it pays, measured at
    warm-up on the real model and cached per GPU model and model (jobs/worker/batch_sizer.py):
    off (the default: the pool is batch_sizes) | auto (on CUDA) | on (any device)."""
    batch_grow_max: int = 64
    """The largest batch size growing may reach."""
    batch_grow_min_gain: float = 0.03
    """Grow only when the larger batch costs this fraction less per image."""
    batch_grow_memory_fraction: float = 0.8
    """Grow only while the predicted peak stays under this fraction of device memory (the rest is for
    captured graphs' pools and fragmentation)."""
    decoder_fusions: bool = True
    """The lossless tier's fused chains in the VAE decoder too, where a rule knows its blocks (SANA's
    DC-AE: bcg/fusions/dc_ae.py), each verified against eager on first sight like the transformer's, so
    the bytes stay eager's; on CUDA with bcg.enabled and bcg.fusions=lossless only. A speed setting: at
    1024², batch 8, on the H200 the decode's elementwise work was over half its GPU time
    (benchmarks/results/vae_decode_h200_s34.md)."""
    invariant: Optional[bool] = None
    """The batch-invariant mode (bcg/invariant, issue 30): the worker installs kernels that compute
    every row the same way whatever its batch, so a sample's bytes are a function of its row (model,
    row, quality tier, device and software stack), not of the batch size, its neighbours, the pool,
    the partition or a resume. The pool (batch_sizes, pad_short_batches, batch_grow) then leaves the
    run identity: a run may resume with another pool.

    null (the default): on where the job renders on CUDA with a quality tier that can hold it
    (lossless or off), off on the CPU and with the compiled forward (`invariant_on`). On the H200
    over a whole SANA-1.6B-size job it cost 1.4% at 1024², and 1.0% while generating at 512², its
    verdicts kept across runs (session 51, job_wall_h200_{1024,512}_s51.md; 7.1% and 4.0% at 1024²,
    3.6% and 8.9% at 512² in sessions 45-46, before its fast paths were kept). On the CPU it costs a
    few x the eager forward on the tiny presets (benchmarks/results/batch_invariance_cpu.md), so a
    CPU job keeps the batch-dependent kernels unless this is true. false: the batch-dependent
    kernels everywhere (the pool is then part of the run identity). Its fused chains' verdicts
    have a cache file of their own (bcg/fusions/cache.py)."""

    def invariant_on(self, device_type: str) -> bool:
        """Whether a job rendering on `device_type` ("cuda", "cpu") runs the batch-invariant mode:
        `invariant` where set, else on CUDA unless the compiled forward (fast tier) is there, whose
        Inductor kernels the mode does not replace."""
        if self.invariant is not None:
            return bool(self.invariant)
        return device_type == "cuda" and self.tier != "fast"

    def __post_init__(self) -> None:
        try:
            super().__post_init__()  # the runner's knobs: checked where they are defined
        except ValueError as e:
            raise UserError(str(e)) from None
        check("bcg.batch_sizes", len(self.batch_sizes) > 0 and all(0 < int(b) <= MAX_BATCH for b in self.batch_sizes),
              list(self.batch_sizes), f"a non-empty list of ints in [1, {MAX_BATCH}], e.g. [8] or [1,2,4,8]")
        if self.text_buckets is not None:
            check("bcg.text_buckets", len(self.text_buckets) > 0 and all(int(b) > 0 for b in self.text_buckets),
                  list(self.text_buckets), "a non-empty list of positive ints, e.g. [64,128,256]")
        for hw in self.warmup_resolutions:
            check("bcg.warmup_resolutions", len(hw) == 2 and all(int(v) > 0 for v in hw), list(hw),
                  "[height, width] pairs")
        check_choice("bcg.capture", self.capture, CAPTURE_POLICIES)
        check("bcg.capture_min_gain", 0 <= self.capture_min_gain < 1, self.capture_min_gain, "a fraction in [0, 1)")
        check_choice("bcg.batch_grow", self.batch_grow, ("auto", "on", "off"))
        check("bcg.batch_grow_max", 0 < self.batch_grow_max <= MAX_BATCH, self.batch_grow_max,
              f"an int in [1, {MAX_BATCH}]")
        check("bcg.batch_grow_min_gain", 0 <= self.batch_grow_min_gain < 1, self.batch_grow_min_gain,
              "a fraction in [0, 1)")
        check("bcg.batch_grow_memory_fraction", 0 < self.batch_grow_memory_fraction <= 1,
              self.batch_grow_memory_fraction, "a fraction in (0, 1]")
        check("bcg.invariant", self.invariant is None or isinstance(self.invariant, bool), self.invariant,
              "true, false or null (on with CUDA)")
        if self.invariant and self.tier == "fast":
            # Inductor's generated kernels (fused reductions, its own GEMM templates) are not the aten
            # ops the mode replaces: the compiled forward would break the contract without a word.
            raise UserError("bcg.invariant=true cannot hold with the compiled forward (bcg.compile=true or "
                            "bcg.fusions=fast): its Inductor kernels are not the ones the batch-invariant mode "
                            "replaces. Use bcg.fusions=lossless (or off) with bcg.compile=false, or leave "
                            "bcg.invariant unset (null: off with the compiled forward) or false")


@dataclass
class JobConfig:
    partition: str = "0/1"
    """`I/N`: run partition I of N of the sorted plan; `slurm_array`: I and N from this Slurm array
    task (SLURM_ARRAY_TASK_ID/COUNT). torchrun ranks split each partition further."""
    overwrite: bool = False
    """Start over in a non-empty output_dir whose previous run had a different dataset or config."""
    extend: bool = False
    """Add the dataset's new rows to the run in output_dir (img2dataset's extend): its done units are
    kept; only the dataset (rows added, a larger dataset.limit) may differ (jobs/plan/extend.py)."""
    on_nonfinite: str = "record"
    """A NaN/Inf image: record (flag it in its json and the summary) | ledger (send it to errors.jsonl)."""
    progress: bool = True
    """Show the progress bar: one per node, for the whole job (every worker's items, rate, ETA)."""
    log_every_s: float = 30.0
    """Also log a progress line this often (for non-interactive logs, e.g. Slurm)."""
    dist_timeout_min: float = 1440.0
    """Ranks (torchrun) wait at most this long at a barrier: the last one waits for the slowest rank."""
    overlap: Optional[bool] = None
    """Overlap text encoding and VAE decoding with denoising (jobs/worker/scheduler.py): true | false | null
    (null: on with CUDA, off on a CPU, where the stages share the same cores). Bytes are the same."""
    verify: str = "members"
    """On resume, check each committed shard against its manifest: members (file size and the member
    list with sizes, from the tar headers; cheap) | full (also sha256: reads every byte)."""
    lease_ttl_s: float = 600.0
    """A worker's lease on a work unit expires this long after its last heartbeat (heartbeats
    every ttl/4); another worker then takes the unit over. Longer than any stall of a live worker."""
    wait_for_leases: bool = True
    """With nothing left to lease, wait for the units other workers hold (taking over any whose
    lease expires) until every unit is done; false: exit and leave them to their holders."""
    tensorboard: Optional[str] = None
    """A folder for TensorBoard: each worker logs images/s, the job's done items and ETA, and the
    graph runner's counters (jobs/telemetry/tensorboard.py). Needs `pip install -e '.[tensorboard]'`."""
    staging_dir: Optional[str] = None
    """With an object-store output_dir (s3://...): the local folder where shards are committed
    before their upload, and where leases and locks live (jobs/output/storage.py). null: a folder per
    output_dir under ~/.cache/bcgen/staging/. Array tasks or nodes sharing one run need a folder
    they all mount (NFS, Lustre)."""

    def __post_init__(self) -> None:
        self.staging_dir, self.tensorboard = home(self.staging_dir), home(self.tensorboard)
        if self.partition != "slurm_array":
            try:
                parse_partition(self.partition)
            except UserError as e:
                raise UserError(f"{e}; or job.partition=slurm_array inside a Slurm job array") from None
        check_choice("job.on_nonfinite", self.on_nonfinite, NONFINITE)
        check_choice("job.verify", self.verify, VERIFY)
        check("job.dist_timeout_min", self.dist_timeout_min > 0, self.dist_timeout_min, "minutes > 0")
        check("job.lease_ttl_s", math.isfinite(self.lease_ttl_s) and 1 <= self.lease_ttl_s <= MAX_TTL_S,
              self.lease_ttl_s,
              f"seconds in [1, {MAX_TTL_S:g}] (a week), e.g. 600: a lease must expire to be taken over")
        check("job.log_every_s", math.isfinite(self.log_every_s) and 0 < self.log_every_s <= 86400, self.log_every_s,
              "seconds in (0, 86400], e.g. 30")
        check("job.dist_timeout_min", math.isfinite(self.dist_timeout_min) and self.dist_timeout_min <= 7 * 1440,
              self.dist_timeout_min, "minutes in (0, 10080]")


@dataclass
class PlanConfig:
    """`python -m jobs.plan` (and the implicit plan of jobs.generate): how work units are cut."""

    unit_items: int = 5000
    """Items per work unit at most (1,000-10,000 suits a GPU: minutes of work, one graph capture).
    Each signature's run is cut into equal units, so a unit never mixes signatures."""
    workers: int = 0
    """Processes that parse, validate and tokenize chunks of the dataset; 0 = one per CPU."""
    chunk_mb: float = 4.0
    """Bytes of the dataset handed to a process at a time (JSONL/TXT); bounds the planner's memory."""

    def __post_init__(self) -> None:
        check("plan.unit_items", self.unit_items >= 1, self.unit_items, "an int >= 1 (1,000-10,000 suits a GPU)")
        check("plan.workers", 0 <= self.workers <= MAX_PLAN_WORKERS, self.workers,
              f"an int in [0, {MAX_PLAN_WORKERS}] (0 = one per CPU)")
        check("plan.chunk_mb", math.isfinite(self.chunk_mb) and 0 < self.chunk_mb <= 256, self.chunk_mb,
              "megabytes in (0, 256]")
        check("plan.unit_items", self.unit_items <= 10_000_000, self.unit_items, "an int in [1, 10000000]")


@dataclass
class RayConfig:
    """`+cluster=ray`: the job runs as a Ray driver handing work units to one actor per worker
    (jobs/cluster/). Absent (null), the job runs as a lease-based worker (torchrun, Slurm, by hand)."""

    address: str = "auto"
    """auto: the running cluster (RAY_ADDRESS, as `ray job submit` sets it, or `ray start` on this
    node) | local: start a cluster on this machine for this job | host:port of a cluster's GCS."""
    workers: int = 0
    """Actors, each one bcgen worker (one model, one device); 0: as many as the cluster's GPUs
    allow at gpus_per_worker each."""
    gpus_per_worker: float = 1.0
    """GPUs Ray reserves per actor (`num_gpus`); 0 for a CPU-only run (tests), which then needs workers."""
    cpus_per_worker: float = 1.0
    """CPUs Ray reserves per actor (`num_cpus`); fractional values pack more actors on a node."""
    max_restarts: int = 3
    """An actor that dies (node lost, OOM kill, `ray.kill`) is replaced at most this many times per
    worker slot; its unit goes back to the queue at once either way."""

    def __post_init__(self) -> None:
        check("ray.address", bool(str(self.address).strip()), self.address, "auto, local or host:port")
        check("ray.workers", self.workers >= 0, self.workers, "an int >= 0 (0: one per GPU of the cluster)")
        check("ray.gpus_per_worker", math.isfinite(self.gpus_per_worker) and self.gpus_per_worker >= 0,
              self.gpus_per_worker, "a number >= 0 (1: one GPU per actor; 0: CPU only)")
        check("ray.cpus_per_worker", math.isfinite(self.cpus_per_worker) and self.cpus_per_worker >= 0,
              self.cpus_per_worker, "a number >= 0, e.g. 1 or 0.25")
        check("ray.max_restarts", self.max_restarts >= 0, self.max_restarts, "an int >= 0")
        if self.workers == 0 and self.gpus_per_worker == 0:
            raise UserError("ray.workers=0 means one actor per GPU, but ray.gpus_per_worker=0 reserves none: "
                            "set ray.workers=N (e.g. ray.workers=2) for a CPU-only run")


def parse_partition(text: str) -> tuple[int, int]:
    try:
        index, count = (int(v) for v in str(text).split("/"))
    except ValueError:
        index, count = -1, 0
    if not (count > 0 and 0 <= index < count):
        raise UserError(f"job.partition={text!r} is invalid: expected I/N with 0 <= I < N, e.g. 0/4")
    return index, count


@dataclass
class GenerateConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    sink: SinkConfig = field(default_factory=SinkConfig)
    bcg: BcgConfig = field(default_factory=BcgConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    job: JobConfig = field(default_factory=JobConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    output_dir: str = "outputs/sana_tiny"
    """Shards, index, summary and error ledger go here; stable across reruns (resume). A local path
    or an object store URL through fsspec (s3://bucket/prefix, gs://...; jobs/output/storage.py)."""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda."""
    ray: Optional[RayConfig] = None
    """Run on a Ray cluster (`+cluster=ray`, conf/cluster/ray.yaml); null: a lease-based worker."""

    def __post_init__(self) -> None:
        self.output_dir = home(self.output_dir)
        check_choice("device", self.device, DEVICES)
        check("output_dir", bool(str(self.output_dir).strip()), self.output_dir, "a directory path")

    @property
    def text_buckets(self) -> List[int]:
        return list(self.bcg.text_buckets or self.model.text_buckets)


def register_configs() -> None:
    """Register the schemas so Hydra type-checks every override and yaml file against them."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from jobs.output.layout import run_folder_name
    from jobs.output.storage import local_dir_of

    # hydra.run.dir (its logs) must be a local folder: an object-store output_dir logs into its staging folder.
    OmegaConf.register_new_resolver("bcgen_local", local_dir_of, replace=True)
    OmegaConf.register_new_resolver("bcgen_run_folder", run_folder_name, replace=True)
    # One schema, for the whole config: it types every group's yaml merged into it. Schemas stored
    # inside a group (model/model_schema) would be listed as presets by `--help` and by Hydra's
    # unknown-preset errors, and are not needed for the typing.
    ConfigStore.instance().store(name="generate_schema", node=GenerateConfig)


def to_typed(cfg) -> GenerateConfig:
    """DictConfig -> GenerateConfig, running every field check (the first bad value raises UserError)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    check_known_keys(cfg)
    try:
        # A structured config's to_object is its dataclass, here the GenerateConfig schema Hydra
        # composed against (register_configs); OmegaConf's annotation can only say "any container".
        return cast(GenerateConfig, OmegaConf.to_object(cfg))
    except UserError:
        raise
    except MissingMandatoryValue as e:
        raise UserError(f"{e.full_key} is required and has no value; "
                        f"pass {e.full_key}=... on the command line") from None
    except ValueError as e:
        # to_object runs nothing but the config dataclasses' checks, so a ValueError here is a bad
        # value: sinks/ (which knows nothing of jobs/) and OmegaConf's own validation raise ValueError.
        raise UserError(str(e)) from None


def check_known_keys(cfg, where: str = "") -> None:
    """Refuse keys the schema does not have. `+foo=1` forces a key past Hydra's struct check, and
    the dataclasses would then drop it silently: a typo'd `+sampling.stpes=4` would change nothing."""
    import dataclasses
    import typing

    from omegaconf import OmegaConf

    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return  # a free-form mapping (a tiny component's config): its keys are its class's to check
    known = {f.name for f in dataclasses.fields(schema)}
    for key in cfg.keys():
        if key not in known:
            name = f"{where}{key}"
            raise UserError(f"{name} is not a config key (from `+{name}=...` or a yaml file?); "
                            f"known keys{' under ' + where.rstrip('.') if where else ''}: {', '.join(sorted(known))}. "
                            f"Remove it, or fix its spelling")
    for name, hint in typing.get_type_hints(schema).items():  # the sub-config sections
        section = next((h for h in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(h)), None)  # Optional[X]
        if section is not None and name in cfg and not OmegaConf.is_missing(cfg, name) and cfg[name] is not None:
            check_known_keys(cfg[name], f"{where}{name}.")
