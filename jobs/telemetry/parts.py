"""One summary for all parts of a job: each part writes its own stats file, whoever finishes a
group merges the files of the current layout.

Files, not a gather: a failing rank still leaves its record, and array tasks, which share no
process group, merge the same way. A part's file that cannot be read (damaged on disk) is left out
with a warning, as a part that has not finished is: the summary says "running" until that part runs
again and writes it anew; the job that finishes is not failed for it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from jobs.output.layout import SUMMARY_DIR
from jobs.telemetry.summary import JobStats
from sinks.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

STATUS_ORDER = ("failed", "interrupted", "preempted", "running", "complete")  # worst first


def part_summary_path(output_dir, part: int, parts: int) -> Path:
    return Path(output_dir) / SUMMARY_DIR / f"part-{part:04d}-of-{parts:04d}.json"


def write_part_summary(output_dir, part: int, parts: int, stats: JobStats) -> None:
    path = part_summary_path(output_dir, part, parts)
    path.parent.mkdir(exist_ok=True)
    data = dict(stats.to_json(), part=part, parts=parts)
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def read_part_summaries(output_dir, parts: int) -> list:
    """The parts' records that exist and can be read (see the module docstring)."""
    out = []
    for part in range(parts):
        path = part_summary_path(output_dir, part, parts)
        if not path.exists():
            continue
        try:
            record = json.loads(path.read_text())
            merge_stats([record], 1)  # every field the merge reads is there, of its type
        except Exception as e:  # noqa: BLE001 - whatever the damage, this part's record is not used
            log.warning("%s cannot be read (%s: %s): part %d is left out of summary.json until it runs again",
                        path, type(e).__name__, e, part)
            continue
        out.append(record)
    return out


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = out.get(k, 0) + v
        else:
            out.setdefault(k, v)
    return out


def _merged_flops(parts: list) -> dict:
    """`parts`: each part's (flops, items written). Parts generate at once: the job's rate is the sum of
    theirs, its peak the sum of their GPUs'. A sample's FLOPs are the mean over every part's samples: parts
    lease different units, so their signatures (sizes, text buckets) and their FLOPs a sample differ."""
    counted = [(f, n) for f, n in parts if f.get("counted") and f.get("flops_per_image")]
    if not counted:
        return next((f for f, _ in parts if f), {})
    tflops = sum(f.get("tflops") or 0.0 for f, _ in counted)
    peaks = [f.get("peak_tflops") for f, _ in counted]
    merged = dict(counted[0][0], tflops=round(tflops, 2), parts=len(counted))
    items = sum(n for _, n in counted)
    for key in ("flops_per_image", "flops_per_image_with_prompt_memo"):
        if items and all(f.get(key) is not None for f, _ in counted):
            merged[key] = sum(f[key] * n for f, n in counted) / items
    merged["peak_tflops"] = sum(peaks) if all(peaks) else None
    merged["peak_fraction"] = round(tflops / merged["peak_tflops"], 4) if merged["peak_tflops"] else None
    return merged


def _merged_invariant(a: dict, b: dict) -> dict:
    """The mode is a run setting (in the identity when on): parts agree on it; their calls add up, and so
    do the call shapes each worker's process verified (fast_paths: each decides its own)."""
    if not b:
        return a
    if not a:
        return dict(b)
    merged = dict(a, devices=sorted(set(a.get("devices", [])) | set(b.get("devices", []))),
                  calls=_add(a.get("calls", {}), b.get("calls", {})))
    fa, fb = a.get("fast_paths", {}), b.get("fast_paths", {})
    if fa or fb:
        merged["fast_paths"] = {k: _add(fa.get(k, {}), fb.get(k, {})) for k in sorted(set(fa) | set(fb))}
    return merged


def merge_stats(records: list, parts: int) -> JobStats:
    """Part records -> one JobStats: counts add up, stage times are the slowest part's (wall
    clock), dataset-wide counts (bad rows) are taken once, the first batch is the earliest part's, and a
    missing part reads as running."""
    statuses = {r["status"] for r in records} | ({"running"} if len(records) < parts else set())
    merged = JobStats(status=next(s for s in STATUS_ORDER if s in statuses))
    merged.modes = Counter()
    merged.kinds = Counter()
    for r in records:
        for name in ("items_planned", "items_written", "items_skipped_done", "truncated_prompts", "oom_splits",
                     "shards"):
            setattr(merged, name, getattr(merged, name) + r[name])
        merged.padding_rows += r.get("padding_rows", 0)  # a summary written before session 32 has none
        merged.bad_rows = max(merged.bad_rows, r["bad_rows"])  # every part read the same dataset
        merged.plan_items = max(merged.plan_items, r.get("plan_items", 0))  # and joined the same plan
        merged.nonfinite_keys += r["nonfinite_keys"]
        merged.modes.update(r["modes"])
        merged.kinds.update(r.get("kinds", {}))
        merged.signatures = _add(merged.signatures, r["signatures"])
        merged.graph = _add(merged.graph, r["graph"])
        merged.sink = _add(merged.sink, r["sink"])
        for stage, s in r["stage_seconds"].items():
            merged.stage_seconds[stage] = max(merged.stage_seconds.get(stage, 0.0), s)
        for part, s in r.get("load_seconds", {}).items():  # a summary written before session 48 has none
            merged.load_seconds[part] = max(merged.load_seconds.get(part, 0.0), s)
        for part, s in r.get("startup_seconds", {}).items():  # nor this, before session 49
            merged.startup_seconds[part] = max(merged.startup_seconds.get(part, 0.0), s)
        first = r.get("first_batch_s")
        if first is not None and (merged.first_batch_s is None or first < merged.first_batch_s):
            merged.first_batch_s = first  # the job's first images: the earliest part's, and its device time
            merged.first_batch_ms = r.get("first_batch_ms", {})
        elif merged.first_batch_s is None and not merged.first_batch_ms:  # no part timed from its process's start
            merged.first_batch_ms = r.get("first_batch_ms", {})
        merged.model, merged.output_dir = r["model"], r["output_dir"]
        merged.gpu_stage_ms = _add(merged.gpu_stage_ms, r.get("gpu_stage_ms", {}))
        merged.capture_policy += r.get("capture_policy", [])
        merged.overlap = merged.overlap or r.get("overlap", False)
        merged.batching = merged.batching or r.get("batching", {})  # one published pick per output_dir
        merged.started = min(filter(None, (merged.started, r.get("started", ""))), default="")  # ISO: sorts as time
        merged.ended = max(merged.ended, r.get("ended", ""))
        merged.invariant = _merged_invariant(merged.invariant, r.get("invariant", {}))
        merged.library_warnings = _add(merged.library_warnings, r.get("library_warnings", {}))
    merged.flops = _merged_flops([(r.get("flops", {}), r["items_written"]) for r in records])
    busy = [r["gpu_busy"] for r in records if r.get("gpu_busy") is not None]
    merged.gpu_busy = sum(busy) / len(busy) if busy else None
    merged.device = ", ".join(sorted({r["device"] for r in records if r["device"]}))
    return merged
