"""The run's identity: every input that decides an output byte, as one JSON-able dict (`run.json`).

A rerun with the same identity joins the run; another one is refused, naming what differs
(jobs/output/claim.py compares and claims; this module only says what the identity is).

The CPU's thread count is part of it: oneDNN and MKL split a GEMM across threads and reduce the
partial sums in an order that follows the split, so the same pipeline gives other floats at 1
thread than at 2 (measured on the tiny SANA and Flux presets: up to 7e-7, enough to change a uint8
pixel in ~100k). A CPU run that resumed with another thread count would mix two renderings in one
output_dir. CUDA kernels do not depend on it: a GPU run leaves it out, and may resume on a host
with any number of cores.

That device part is the renderer's, not the planner's: torch alone knows its thread count (MKL's
rule: OMP_NUM_THREADS, MKL_NUM_THREADS, physical cores, the affinity mask) and whether CUDA is
usable, and `python -m jobs.plan` runs no tensor op and imports no torch; it may also run on a
login node without the workers' GPUs. A job that renders passes its `Renderer`; a job that
renders nothing takes the run's device part as it is, and where there is no run yet it claims one
with the device part pending (a GPU config's is known: none), which the first worker settles
(jobs/plan/publish.py). How the renderer batches belongs to that part: with bcg.invariant=null the
batch-invariant mode is on with CUDA and off on the CPU, so whether the pool is in the identity
follows from the device too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from jobs.config import GenerateConfig
from jobs.models import demo_weights
from jobs.models.lora import lora_identity
from jobs.models.registry import get_family

#: The device part of a run claimed by a job that renders nothing (`python -m jobs.plan`): its first
#: worker replaces it with its own (`Renderer.identity`).
DEVICE_PENDING = {"device": "pending"}
#: The renderer's own keys of the device part (`Renderer.identity`, `DEVICE_PENDING`): its thread count, its device.
RENDERER_KEYS = ("cpu_threads", "device")
#: Every top-level identity key the device part may hold: the renderer's own and how it batches
#: (`batching_identity`), which follows from them and the bcg config (bcg.invariant=null: on with CUDA).
DEVICE_KEYS = RENDERER_KEYS + ("invariant", "batching")


@dataclass(frozen=True)
class Renderer:
    """The process that renders the run's items: its torch device ("cpu", "cuda", "cuda:1") and
    torch's CPU thread count, as the worker reads them from torch."""

    device: str
    cpu_threads: int

    def identity(self) -> dict:
        """Its device part of the run identity: a CPU run's thread count; a CUDA run's nothing."""
        return {"cpu_threads": int(self.cpu_threads)} if self.device == "cpu" else {}


def device_part(identity: dict) -> dict:
    """The device part of an identity (run.json's, plan.json's, a job's)."""
    return {k: identity[k] for k in DEVICE_KEYS if k in identity}


def renders_on(part: dict) -> Optional[str]:
    """The device type ("cuda", "cpu") a device part (`Renderer.identity`, `unsettled_device`) was
    made by, or None while it is pending."""
    if part.get("device") == DEVICE_PENDING["device"]:
        return None
    return "cpu" if "cpu_threads" in part else "cuda"


def unsettled_device(cfg: GenerateConfig) -> dict:
    """The device part a job that renders nothing claims a new run with: none for device=cuda (no
    thread count to record), else pending."""
    return {} if cfg.device == "cuda" else dict(DEVICE_PENDING)


def run_identity(cfg: GenerateConfig, digest: str, n_records: int, weights: Optional[str] = None,
                 device: Optional[dict] = None, model_path: Optional[str] = None) -> dict:
    """`weights`: the digest of the files under model.path (jobs/plan/weights_digest.py), None where
    there is none to record (a tiny preset; a plan made before weight digests, whose run.json has none).
    `model_path`: the path the run names its weights by, where this job loads the same weights from
    another one (weights_digest.run_model_path); None: model.path.
    `device`: the renderer's part (`Renderer.identity`); None: `unsettled_device`. The batching part
    follows from it (`batching_identity`): pending with it, it is settled with it by the first worker."""
    m = cfg.model
    part = unsettled_device(cfg) if device is None else device
    sampling, sink = asdict(cfg.sampling), {"format": cfg.sink.format, "quality": cfg.sink.quality}
    if get_family(m.family).video:
        sink.update(video_crf=cfg.sink.video_crf, video_preset=cfg.sink.video_preset,
                    video_frames=cfg.sink.video_frames)
    else:
        # An image family makes one frame and writes no video: these change none of its bytes, and
        # leaving them out keeps the identity of runs made before videos existed (they still resume).
        del sampling["num_frames"], sampling["fps"]
    if sampling["images_per_prompt"] == 1:
        del sampling["images_per_prompt"]  # one sample a row, as every run before it made: still resumes
    return {
        "dataset": {"digest": digest, "records": n_records},
        "model": {"name": m.name, "family": m.family, "path": m.path if model_path is None else model_path,
                  "dtype": m.dtype,
                  "tiny": m.tiny.identity() if m.tiny is not None else {},
                  "max_sequence_length": m.max_sequence_length,
                  "complex_human_instruction": m.complex_human_instruction, **lora_identity(m.loras),
                  **demo_weights.identity(m.tiny, m.path), **({"scheduler": m.scheduler} if m.scheduler else {}),
                  **({"weights": weights} if weights else {})},
        "text_buckets": cfg.text_buckets,
        "sampling": sampling,
        "sink": sink,
        "bcg_fusions": cfg.bcg.fusions,  # the quality tier: fast changes pixels, lossless must not
        "bcg_compile": cfg.bcg.compile,  # compiled kernels change pixels; graph replay alone does not
        **part,
        **batching_identity(cfg.bcg, renders_on(part)),
    }


def batching_identity(bcg, device_type: Optional[str]) -> dict:
    """How items are batched, where it changes bytes, on a `device_type` renderer (None: not known
    yet, the device part pending: nothing; the first worker settles it with its device, as
    bcg.invariant=null follows the device).

    Without the batch-invariant mode the batch an item is denoised in changes its bytes (kernels pick
    other reductions per batch size: 5 of 40 JPEGs differed between batch 1 and 8), so the batching is
    part of the identity; grown sizes are measured once per output_dir and published in
    _plan/batching.json, so every worker and resume cuts the same batches (jobs/worker/batch_sizer.py).
    With the mode a row's bytes are its own whatever its batch: the pool is a speed setting, and the
    identity says only that the contract holds."""
    if device_type is None:
        return {}
    if bcg.invariant_on(device_type):
        return {"invariant": True}
    return {"batching": {"batch_sizes": list(bcg.batch_sizes), "pad_short_batches": bcg.pad_short_batches,
                         "batch_grow": bcg.batch_grow, "batch_grow_max": bcg.batch_grow_max}}


def plan_identity(cfg: GenerateConfig, digest: str, records: int, weights: Optional[str] = None,
                  device: Optional[dict] = None, model_path: Optional[str] = None) -> dict:
    ident = run_identity(cfg, digest, records, weights, device, model_path)
    ident["plan"] = {"unit_items": cfg.plan.unit_items, "dataset_limit": cfg.dataset.limit,
                     "dataset_on_error": cfg.dataset.on_error}
    if cfg.dataset.keep_fields:  # they are in every json: another list is another output
        ident["plan"]["dataset_keep_fields"] = list(cfg.dataset.keep_fields)
    return ident

