"""How fast this kind of job ran: work (the plan's cost, megapixel-steps) per second of generation.

    measured_rate(output_dir, cost_of)   from the run's timeline: every batch's items x their cost per item,
                                         over the generate seconds of each part's runs
    record_rate(key, rate) / cached_rates(model, tier)
                                         <user cache>/rates.json (BCGEN_RATE_CACHE; jobs/user_cache.py): the
                                         last measured rate per (model, device, quality tier), written by
                                         every job that finishes, read by `jobs.plan --estimate`; the model
                                         is the preset's name and its transformer's architecture
                                         (`rate_model`): model=sana at 600M and at 1.6B are two speeds

A rate is per worker (one process, one GPU): the time of W workers is the time of one over W. Each worker
also waits before its first batch (its start-up, the plan, the model's load): a rate carries that job's
wait, summary.json's `first_batch_s`: for a short job, most of what a user waits for.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from jobs.output.layout import SUMMARY_FILE
from jobs.telemetry.timeline import read_timeline
from jobs.user_cache import user_cache_dir
from sinks.atomic import atomic_write_bytes

RATE_CACHE_ENV = "BCGEN_RATE_CACHE"


@dataclass(frozen=True)
class Rate:
    cost_per_s: float  # megapixel-steps a second, one worker
    items: int  # what it was measured on
    seconds: float
    source: str  # where it was measured, for a person
    device: str = ""
    first_batch_s: Optional[float] = None  # that job's wait from its process's start to its first batch


def measured_rate(output_dir: Path, cost_of: Mapping[str, float], source: str = "") -> Optional[Rate]:
    """The rate of the batches in output_dir's timeline whose signature has a cost, with the wait for the
    first batch of the job that last wrote its summary; None without any batch."""
    entries = read_timeline(output_dir)
    cost, items, seconds = 0.0, 0, 0.0
    runs: Dict[tuple, float] = {}
    for e in entries:
        if e.signature in cost_of:
            cost += e.items * cost_of[e.signature]
            items += e.items
            runs[(e.part, e.start)] = max(runs.get((e.part, e.start), 0.0), e.t)
    seconds = sum(runs.values())
    if not items or seconds <= 0:
        return None
    return Rate(cost_per_s=cost / seconds, items=items, seconds=seconds,
                source=source or f"measured on {items} items in {output_dir}",
                first_batch_s=first_batch_wait(output_dir))


def first_batch_wait(output_dir: Path) -> Optional[float]:
    """The last job's wait in output_dir from its process's start to its first batch (summary.json); None
    where none was timed (a rerun with nothing to do, a job started from Python) or it cannot be read."""
    return _positive(_read(output_dir / SUMMARY_FILE).get("first_batch_s"))


def _positive(value) -> Optional[float]:
    """A number of seconds read from a file another process wrote, or None where it is not one."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def rate_cache(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get(RATE_CACHE_ENV):
        return Path(environ[RATE_CACHE_ENV])
    return user_cache_dir(environ) / "rates.json"


def rate_model(name: str, transformer_config: Optional[Mapping]) -> str:
    """The model a rate is cached under: `NAME#DIGEST`, the preset's name and a digest of its transformer's
    config (the checkpoint's config.json, or the tiny preset's section), its `_`-keys (the diffusers version
    that saved it, its class name) left out: the architecture sets the speed, not the weights' values or
    where they lie. Without a config, the name alone."""
    if not transformer_config:
        return name
    arch = {k: v for k, v in dict(transformer_config).items() if not str(k).startswith("_")}
    digest = hashlib.sha256(json.dumps(arch, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{name}#{digest}"


def rate_key(model: str, device: str, tier: str) -> str:
    return f"{model}|{device}|{tier}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or torn by a crash: a cache, not a record
    return data if isinstance(data, dict) else {}


def record_rate(model: str, device: str, tier: str, rate: Rate, when: str) -> None:
    path = rate_cache()
    data = _read(path)
    data[rate_key(model, device, tier)] = dict(asdict(rate), device=device, measured=when)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def cached_rates(model: str, tier: str) -> List[Rate]:
    """Every device's cached rate of this model at this tier, fastest first."""
    out = []
    for key, d in _read(rate_cache()).items():
        m, device, t = (key.split("|") + ["", ""])[:3]
        if m == model and t == tier and d.get("cost_per_s", 0) > 0:
            out.append(Rate(cost_per_s=d["cost_per_s"], items=d["items"], seconds=d["seconds"], device=device,
                            source=f"cached: {d['items']} items on {device} at {d.get('measured', '?')} "
                                   f"({rate_cache()})", first_batch_s=_positive(d.get("first_batch_s"))))
    return sorted(out, key=lambda r: -r.cost_per_s)
