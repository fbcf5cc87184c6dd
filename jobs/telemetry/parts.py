"""One summary for all parts of a job: each worker writes its own stats file, whoever finishes a
group merges the files of the current layout.

    _summary/part-PPPP-of-NNNN-HOST-PID.json     one worker process's record (part PPPP of a layout of NNNN)

Files, not a gather: a failing rank still leaves its record, and array tasks, which share no
process group, merge the same way. A part's file that cannot be read (damaged on disk) is left out
with a warning, as a part that has not finished is: the summary says "running" until that part runs
again and writes it anew; the job that finishes is not failed for it.

A part may have several workers at once (two processes started by hand with the same job.partition,
each with its own host and pid): each keeps its own record, and the summary counts them all. What
it leaves out is a part's earlier runs: a rerun of the part (a resume) says what the rerun did, and the
items earlier runs committed are its "already done". So of each part the records merged are those of
its latest session, the workers whose runs overlapped in time (`latest_session`); the leader that
writes summary.json removes the older ones (`drop_earlier_sessions`), so `_summary/` does not grow with
every rerun. Records written before the worker was in the name (`part-PPPP-of-NNNN.json`) are read the same way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from jobs.output.layout import SUMMARY_DIR
from jobs.telemetry.summary import JobStats
from sinks.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

STATUS_ORDER = ("failed", "interrupted", "preempted", "running", "complete")  # worst first
PART_FILE = re.compile(r"part-([0-9]{4,})-of-([0-9]{4,})(?:-(.+))?\.json")


def this_worker() -> str:
    """This process, as its record's name says it: `HOST-PID`."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', socket.gethostname())}-{os.getpid()}"


def part_summary_path(output_dir, part: int, parts: int, worker: str = "") -> Path:
    """A worker's record (`worker`: this_worker()); without one, the name records had before session 56."""
    return Path(output_dir) / SUMMARY_DIR / f"part-{part:04d}-of-{parts:04d}{f'-{worker}' if worker else ''}.json"


def write_part_summary(output_dir, part: int, parts: int, stats: JobStats, done_at_start: int = 0,
                       worker: Optional[str] = None) -> None:
    """`done_at_start`: the items of units done before this worker began that its `items_skipped_done`
    counts (part 0 counts them, jobs/worker/run.py): the merge counts them once a session."""
    path = part_summary_path(output_dir, part, parts, this_worker() if worker is None else worker)
    path.parent.mkdir(exist_ok=True)
    data = dict(stats.to_json(), part=part, parts=parts, done_at_start=done_at_start)
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def read_part_summaries(output_dir, parts: int) -> list:
    """Of each part of the layout, the records of its latest session that can be read (see the module
    docstring), in part order."""
    out = []
    for _, found in sorted(_records(output_dir, parts).items()):
        out += latest_session([record for _, record in found])
    return out


def drop_earlier_sessions(output_dir, parts: int) -> None:
    """Remove the layout's records of a part's earlier sessions (under the finish lock, by the leader
    that writes summary.json): never read again, since a part's latest session is what it reports."""
    for found in _records(output_dir, parts).values():
        kept = {id(r) for r in latest_session([record for _, record in found])}
        for path, record in found:
            if id(record) not in kept:
                path.unlink(missing_ok=True)


def _records(output_dir, parts: int) -> Dict[int, List[Tuple[Path, dict]]]:
    """{part: [(path, record)]} of the layout of `parts`; a record that cannot be read is left out, with a warning."""
    folder = Path(output_dir) / SUMMARY_DIR
    out: Dict[int, List[Tuple[Path, dict]]] = {}
    for path in sorted(folder.glob("part-*.json")) if folder.is_dir() else []:
        name = PART_FILE.fullmatch(path.name)
        if name is None or int(name.group(2)) != parts or int(name.group(1)) >= parts:
            continue  # another layout's (a rerun with other job.partition or ranks): not this one's parts
        part = int(name.group(1))
        try:
            record = json.loads(path.read_text())
            merge_stats([record], 1)  # every field the merge reads is there, of its type
        except Exception as e:  # noqa: BLE001 - whatever the damage, this part's record is not used
            log.warning("%s cannot be read (%s: %s): part %d is left out of summary.json until it runs again",
                        path, type(e).__name__, e, part)
            continue
        out.setdefault(part, []).append((path, record))
    return out


def latest_session(records: list) -> list:
    """The records of workers whose runs overlapped the latest one's, directly or through another's
    (`started` .. `ended`, UTC ISO to the second, which sorts as time): the part's latest session.
    Runs one after another (a kill and a resume) are sessions of their own."""
    session: list = []
    end = ""
    for record in sorted(records, key=lambda r: (r.get("started") or "", r.get("ended") or "")):
        started, ended = record.get("started") or "", record.get("ended") or ""
        if session and started < end:
            session.append(record)
        else:
            session = [record]  # began after every run before it ended: a new session
        end = max(end, ended) if len(session) > 1 else ended
    return session


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
    reported = {r.get("part", i) for i, r in enumerate(records)}  # a part may have several workers' records
    statuses = {r["status"] for r in records} | ({"running"} if len(reported) < parts else set())
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
    merged.items_skipped_done -= _done_at_start_counted_again(records)
    merged.flops = _merged_flops([(r.get("flops", {}), r["items_written"]) for r in records])
    busy = [r["gpu_busy"] for r in records if r.get("gpu_busy") is not None]
    merged.gpu_busy = sum(busy) / len(busy) if busy else None
    merged.device = ", ".join(sorted({r["device"] for r in records if r["device"]}))
    return merged


def _done_at_start_counted_again(records: list) -> int:
    """The items of units done before the session that more than one record counts: two workers of part 0
    at once each count what was done when they began. The earliest's count is the session's (a later one's
    includes what the earlier had done by then, which the earlier counts as written)."""
    counted = [r for r in records if r.get("done_at_start")]
    if len(counted) < 2:
        return 0
    first = min(counted, key=lambda r: r.get("started") or "")
    return sum(r["done_at_start"] for r in counted) - first["done_at_start"]
