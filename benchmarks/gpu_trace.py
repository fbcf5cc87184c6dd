"""The GPU's own timeline over a window of a running job (issue 28): is a steady batch's time the kernels'?

The default job's steady batch at 1024² is 2.177 s for 8 images (job_wall_h200_1024_1000_s37.md), while
the standalone profiles add up to about 2.11 s of kernels (20 fused forwards of 93.9 ms,
profile_fusions_sana_1024_b8_h200_s36.json, and the fused decode's 225 ms, vae_decode_h200_fused_s34.md).
Whether the other 3% is the GPU idling between batches, the stages slowing each other on their streams,
or lower clocks under a sustained load, only the device's own record of that window can tell. This
traces CUDA kernels, copies and memsets process-wide (CUPTI, torch.profiler) from START_S to
START_S + SECONDS after this module is installed, samples nvidia-smi's clocks and power over the same
window, and writes a summary JSON:

    BENCH_TRACE=START_S:SECONDS:PATH python benchmarks/probed.py -m jobs.generate [overrides...]

Tracing costs the traced process some host time; read the shares and the gaps, not the job's wall.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"


def union_busy(spans: list) -> float:
    """Microseconds covered by at least one of the (start, end) spans."""
    busy, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        busy += e - max(s, end)
        end = e
    return busy


def gaps(spans: list, least_us: float) -> list:
    """(start, length) of each stretch with no span running, at least `least_us` long, between the
    first span's start and the last one's end."""
    out, end = [], None
    for s, e in sorted(spans):
        if end is not None and s - end >= least_us:
            out.append((end, s - end))
        end = e if end is None else max(end, e)
    return out


def summarize(events: list, top: int = 25) -> dict:
    """A chrome trace's device events (torch.profiler's export: ts and dur in microseconds, the stream
    in args) -> the window, the time any stream was busy, each stream's own busy time, the time two or
    more streams ran at once, the idle gaps, and the kernels that took the most time."""
    dev = [e for e in events if e.get("cat") in _DEVICE_CATS and e.get("dur") is not None]
    if not dev:
        return {"events": 0}
    spans = [_span(e) for e in dev]
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    by_stream: dict = {}
    for e in dev:
        by_stream.setdefault(_stream(e), []).append(e)
    per_stream = {k: union_busy([_span(e) for e in v]) for k, v in by_stream.items()}
    busy = union_busy(spans)
    idle = gaps(spans, 100.0)
    return {"events": len(dev), "window_ms": round((t1 - t0) / 1e3, 2), "busy_ms": round(busy / 1e3, 2),
            "busy_fraction": round(busy / (t1 - t0), 4) if t1 > t0 else None,
            "stream_busy_ms": {k: round(v / 1e3, 2) for k, v in sorted(per_stream.items())},
            # the streams' own times add up to more than the union where they ran at once
            "overlap_ms": round((sum(per_stream.values()) - busy) / 1e3, 2),
            "gaps_over_0.1ms": {"count": len(idle), "ms": round(sum(g for _, g in idle) / 1e3, 2),
                                "longest_ms": sorted((round(g / 1e3, 2) for _, g in idle), reverse=True)[:10]},
            "kernels_ms": round(sum(float(e["dur"]) for e in dev if e["cat"] == "kernel") / 1e3, 2),
            "top": _ranked(dev, top),
            # which stream ran what: the denoiser's, the decoder's and the text encoder's kernels apart
            "stream_top": {k: _ranked(v, 10) for k, v in sorted(by_stream.items())}}


def _span(e: dict) -> tuple:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def _stream(e: dict) -> str:
    return str((e.get("args") or {}).get("stream", e.get("tid")))


# What CUPTI says of a kernel's launch (torch.profiler's chrome trace args): the occupancy a slow kernel got
_LAUNCH = ("grid", "block", "registers per thread", "shared memory", "est. achieved occupancy %")


def _ranked(events: list, top: int) -> list:
    """The `top` names by summed duration: name (cut to 120 characters), calls, ms, and for a kernel its
    first launch's grid, block, registers, shared memory and estimated occupancy."""
    names: dict = {}
    launch: dict = {}
    for e in events:
        n, total = names.get(e["name"], (0, 0.0))
        names[e["name"]] = (n + 1, total + float(e["dur"]))
        args = e.get("args") or {}
        launch.setdefault(e["name"], {k: args[k] for k in _LAUNCH if k in args})
    ranked = sorted(names.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"name": k[:120], "calls": n, "ms": round(t / 1e3, 2), **({"launch": launch[k]} if launch[k] else {})}
            for k, (n, t) in ranked]


def smi_summary(lines: list) -> dict:
    """nvidia-smi's CSV samples (noheader, nounits) -> min, median and max of each field."""
    cols: dict = {f: [] for f in _SMI_FIELDS.split(",")}
    for line in lines:
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(cols):
            continue
        for f, v in zip(cols, vals):
            try:
                cols[f].append(float(v))
            except ValueError:
                pass
    out = {}
    for f, vs in cols.items():
        if vs:
            vs = sorted(vs)
            out[f] = {"min": vs[0], "median": vs[len(vs) // 2], "max": vs[-1], "samples": len(vs)}
    return out


def _trace(start_s: float, seconds: float, path: Path, t_installed: float) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    time.sleep(max(0.0, start_s - (time.perf_counter() - t_installed)))
    try:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits",
                                "-lms", "200", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:  # no nvidia-smi (a CPU machine): the kernels alone
        smi = None
    began = time.time()
    with profile(activities=[ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]) as prof:
        time.sleep(seconds)
    ended = time.time()
    smi_out = ""
    if smi is not None:
        smi.terminate()
        smi_out, _ = smi.communicate(timeout=10)
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out = {"window_unix": [round(began, 3), round(ended, 3)], "device": device,
           **summarize(events), "nvidia_smi": smi_summary(smi_out.splitlines())}
    path.write_text(json.dumps(out, indent=1))


def install(start_s: float, seconds: float, path: Path) -> threading.Thread:
    """Trace the window [start_s, start_s + seconds) from now, on a daemon thread; write to path."""
    th = threading.Thread(target=_trace, args=(start_s, seconds, Path(path), time.perf_counter()),
                          name="bench-gpu-trace", daemon=True)
    th.start()
    # A program that ends inside the window still gets its trace: `python -m jobs.generate` leaves
    # through os._exit after the atexit handlers (jobs/fast_exit.py), not back through probed.py.
    atexit.register(th.join, start_s + seconds + 60)
    return th


def install_from_env() -> threading.Thread | None:
    """install() as $BENCH_TRACE=START_S:SECONDS:PATH asks, if set (benchmarks/probed.py)."""
    spec = os.environ.get("BENCH_TRACE")
    if not spec:
        return None
    start, seconds, path = spec.split(":", 2)
    return install(float(start), float(seconds), Path(path))
