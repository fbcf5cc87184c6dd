"""The time a user waits (issue 28): images/s from process start to exit, per mode, over several runs.

    python benchmarks/bench_job_wall.py --dir /tmp/sana16 --res 1024 --prompts 200 --runs 3 \
        --modes bcg,plain8,plain8-compile --gpus 0,1,2 --budget-s 480 --out benchmarks/results

Every run is a fresh process timed from outside, from its start to its exit: the job with its plan,
model load, batch sizing, captures and shard writing; the plain loop with its imports, model load
and (for `-compile`) its compile. Modes:
    bcg              python -m jobs.generate model=sana model.path=DIR ... (the default job)
    off              the same with bcg=off bcg.batch_grow=off
    <job mode>       any other mode of bench_job_realsize.JOB_MODES (bcg-nofuse, bcg-serial, ...; issue 30's
                     contract: bcg-invariant = bcg.invariant=true, bcg-fixed8 = bcg.batch_sizes=[8]; since session
                     52 the mode is the default on CUDA, and bcg-variant = bcg.invariant=false is the fast path)
    plainN           SanaPipeline.from_pretrained(DIR) called on N prompts at a time (no warm-up call:
                     what a user runs; it writes no files)
    plain-picked     the plain loop at the largest batch the bcg run of this call picked (needs bcg;
                     skipped as a duplicate when that is a plain mode already listed)
    plainN-compile   the plain loop with pipe.transformer = torch.compile(pipe.transformer)
Per mode and prompt count: wall images/s (median, min, max of --runs), generation-stage images/s
(the job's summary; the plain loop's batches after its first), first_batch_s (process start to the
first batch out of the decoder: the job's first _timeline line, start + t; the plain loop's first
call), and the generation stage's model TFLOP/s (jobs/models/flops/, each mode's own text
lengths: the job's buckets, the pipeline's 300) with its fraction of the GPU's dense bf16 peak.
Each job run in the JSON also says where its generate stage went: device time by stage (encode,
denoise, decode), captures and their seconds, padding rows, and the batches' pace from its timeline
(`batch_pace`: a steady batch's interval, the seconds other intervals took above it, those across a
signature switch, and the slowest intervals). --gc records each job run's garbage collections
(gc_pauses.py): their seconds over the generate stage and inside each of its slowest intervals.
--trace START:SECONDS records the GPU's kernels and clocks over that window of every run (gpu_trace.py):
busy time, the streams' overlap, idle gaps, the top kernels.

Modes run in lanes, one per GPU of --gpus (round robin), each lane's runs in series; run i of
every mode is done before run i+1 of any mode of that lane. --lanes runs spreads the runs instead: every
lane takes the next run of one shared list (run i of every mode before run i+1 of any) when its last one
ends, so runs of one mode go on at once on several GPUs of the host, each with its own output folder (on
8 GPUs, 3 runs of 3 modes at 1024² and 1,000 prompts end in about the eager loop's one run, where one GPU
takes 3 + 3 + 3 in series: longer than a session's device time). Each run records its GPU; runs side by
side share the host's CPUs, disk and page cache. The model folder is built once (`--build`,
bench_job_realsize.py build) and read once before the first run (page cache warm).
Triton's, Inductor's and bcgen's own caches (its verdicts and digests, BCGEN_CACHE_DIR), all under
--work: --cache warm (default) shares them between the runs of a mode (run 1 compiles cold, the rest
reuse: the median is a warm run), --cache cold gives each run empty ones. Until session 47 bcgen's own
stayed in the user's cache folder, so a "cold" run had them warm.
--warmup N first runs each job and compiled mode once on N prompts of the timed set, an equal share from
each unit the job plans it into (so every text bucket is warm), in that shared cache, untimed, so
that run 1 is warm too (with --resume over device calls: the cache is --work's).
A run that would end past --budget-s (estimated from the mode's last run) is skipped and said so.
--pyspy DIR runs every run under py-spy (idle frames and every thread; --pyspy-format speedscope keeps
the samples in time order) and copies the job's own log beside it: read them with pyspy_tree.py.
Those runs' timings are not results.
Rows are written after every run; the table is printed last.

--family flux: the same at Flux.1-dev size (bench_job_realsize.py build --family flux: a random-weight
FLUX.1-dev folder, ~34 GB), e.g.

    python benchmarks/bench_job_wall.py --family flux --build --dir /tmp/flux --res 1024 --prompts 200 \
        --runs 3 --modes bcg,off,plain8 --once off --bytes-against off --steps 4 --gpus 0 \
        --work /tmp/fw --out /tmp/fres --resume

Its runs take longer than one 10-minute device call: run the same command again while the machine is
warm (`--resume` keeps --work's outputs and caches and the runs already in --out's JSON, and runs
only what is missing), then copy --out's files back. A single run longer than a call (the eager loop at
5,000 prompts: about 13 minutes at 512² on an H100) cannot be resumed: start the whole command with
`benchmarks/detached.sh start DIR -- python benchmarks/bench_job_wall.py ...` (its own process session
outlives the call), and `benchmarks/detached.sh wait DIR 580` in the calls after it.

The job is `model=flux` (conf/model/flux.yaml: T5 at max_sequence_length 512, guidance 3.5 into the
distilled guidance embedding, no negative branch); plainN is FluxPipeline.from_pretrained(DIR) called
with the same steps, size, guidance, per-item CPU seeds and max_sequence_length (the preset's, or
--extra model.max_sequence_length=N). FLOPs count one transformer row per step for both (FluxPipeline
at true_cfg_scale 1 runs no negative branch), at 512 text tokens. Results: job_wall_flux_<tag>.
--tiny (the default with --device cpu) builds and runs a narrow folder of the same classes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Deque

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_job_realsize import JOB_MODES, PROMPTS  # noqa: E402

H200_PEAK_TFLOPS = 989.0  # where the GPU's name is not in jobs/models/flops/base.py's table (a CPU smoke run)
PIPELINE_TEXT_LEN = 300  # SanaPipeline encodes every prompt to max_sequence_length
# Per family: the size in the titles, the plain loop's pipeline class and the keywords of its call beyond
# prompt, guidance_scale, num_inference_steps, height, width, generator, output_type (Flux adds
# max_sequence_length, the job's T5 length: text_length), and the default --guidance (the preset's).
FAMILIES = {
    "sana": dict(title="SANA-1.6B", pipeline="SanaPipeline", guidance=4.5,
                 call={"negative_prompt": "", "use_resolution_binning": False}),
    "flux": dict(title="Flux.1-dev", pipeline="FluxPipeline", guidance=3.5, call={}),
}
COLUMNS = ["mode", "resolution", "prompts", "batch", "runs", "wall_images_per_s", "wall_images_per_s_min",
           "wall_images_per_s_max", "images_per_s", "first_batch_s", "tflops", "peak_fraction", "wall_s", "fixed_s",
           "pace_s", "bytes_equal", "skipped"]

PLAIN_LOOP = r'''
import json, sys, time
path, prompts, res, steps, guidance, batch, compile_, device, pipeline, call = sys.argv[1:]
res, steps, guidance, batch, call = int(res), int(steps), float(guidance), int(batch), json.loads(call)
import torch
import diffusers
texts = [json.loads(l)["prompt"] for l in open(prompts)]
dtype = torch.bfloat16 if device == "cuda" else torch.float32
t0 = time.perf_counter()
pipe = getattr(diffusers, pipeline).from_pretrained(path, torch_dtype=dtype, local_files_only=True).to(device)
pipe.set_progress_bar_config(disable=True)
if compile_ == "1":
    pipe.transformer = torch.compile(pipe.transformer)  # the one line a strong user adds
load = time.perf_counter() - t0
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
first_unix = first_n = t_first = None
n = 0
for i in range(0, len(texts), batch):
    chunk = texts[i:i + batch]
    g = [torch.Generator("cpu").manual_seed(i + j) for j in range(len(chunk))]
    n += len(pipe(prompt=chunk, guidance_scale=guidance, num_inference_steps=steps,
                  height=res, width=res, generator=g, output_type="pil", **call).images)
    if first_unix is None:
        sync()
        first_unix, first_n, t_first = time.time(), n, time.perf_counter()
sync()
gen = time.perf_counter() - t_first
print("PLAIN " + json.dumps({"items": n, "load_s": round(load, 2), "first_batch_unix": first_unix,
                            "pipeline": type(pipe).__name__,
                            "images_per_s": round((n - first_n) / gen, 3) if n > first_n else None}))
'''


# -- one run ----------------------------------------------------------------------------------
def child_env(gpu, cache: Path) -> dict:
    """A run's environment: its GPU, and every cache it reads under `cache`: Triton's, Inductor's and
    bcgen's own (BCGEN_CACHE_DIR: the fused chains' and the invariant mode's verdicts, the weights'
    digests, the batch sizes), so --cache cold starts a run with all of them empty."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TRITON_CACHE_DIR=str(cache / "triton"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               BCGEN_CACHE_DIR=str(cache / "bcgen"))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


def timed(cmd: list, env: dict, log: Path) -> tuple:
    """(unix start, wall seconds, stdout) of one process, started and reaped here.

    With BENCH_PYSPY_DIR set, the process runs under `py-spy record` (every thread, idle frames
    too, collapsed stacks to <dir>/<log name>.pyspy): where the fixed costs go, not a timing."""
    spy = os.environ.get("BENCH_PYSPY_DIR")
    if spy:
        fmt = os.environ.get("BENCH_PYSPY_FORMAT", "raw")  # speedscope keeps the samples' order: slice by time
        name = f"{log.stem}.pyspy" if fmt == "raw" else f"{log.stem}.speedscope.json"
        cmd = ["py-spy", "record", "--idle", *(["--threads"] if fmt == "raw" else []), "--format", fmt,
               "--rate", "50", "--nonblocking", "-o", str(Path(spy) / name), "--", *cmd]
    with open(log, "w") as err:
        start_unix, t0 = time.time(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        wall = time.perf_counter() - t0
    if spy:
        shutil.copy(log, Path(spy) / log.name)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}; see {log}:\n{log.read_text()[-3000:]}")
    return start_unix, wall, proc.stdout


def run_job(a, mode: str, data: Path, out: Path, env: dict, log: Path) -> dict:
    from jobs.telemetry.timeline import read_timeline

    shutil.rmtree(out, ignore_errors=True)  # a fresh output_dir: nothing to resume, batch sizing measured again
    overrides = [*job_overrides(a, data, out), "job.progress=false", *JOB_MODES.get(mode, []), *a.extra]
    gc_file = log.with_suffix(".gc.json")
    if a.gc:  # the same job, with the process's garbage collections recorded (gc_pauses.py)
        gc_file.unlink(missing_ok=True)
        env = dict(env, BENCH_GC_FILE=str(gc_file))
    cmd, env = probed(a, ["-m", "jobs.generate", *overrides], env, log)
    start, wall, _ = timed(cmd, env, log)
    spy = os.environ.get("BENCH_PYSPY_DIR")
    for job_log in (out / "logs").glob("*/generate.log") if spy else ():
        shutil.copy(job_log, Path(spy) / f"{log.stem}.generate.log")  # the job's own stage lines, timestamped
    s = json.loads((out / "summary.json").read_text())
    batches = read_timeline(out)
    firsts = [e.start + e.t for e in batches]
    sizes = (s.get("batching") or {}).get("sizes") or [8]  # the image presets' default pool
    graph = s.get("graph") or {}
    pace = batch_pace(batches)
    gc_seen = gc_report(gc_file, batches, s, pace) if a.gc else {}
    trace = trace_report(log)
    return {"wall_s": wall, "start_unix": round(start, 3), "items": s["items_written"], "images_per_s": s["images_per_s"],
            "first_batch_s": min(firsts) - start if firsts else None, "batch": max(int(b) for b in sizes),
            "signatures": s.get("signatures", {}), "gpu_busy": s.get("gpu_busy"),
            "stage_seconds": s.get("stage_seconds", {}), "load_seconds": s.get("load_seconds", {}),
            "startup_seconds": s.get("startup_seconds", {}), "first_batch_ms": s.get("first_batch_ms", {}),
            # where the generate stage went: device time by stage, captures, padding, the batches' pace
            "gpu_stage_ms": s.get("gpu_stage_ms"), "padding_rows": s.get("padding_rows"),
            "captures": graph.get("captures"), "capture_seconds": graph.get("capture_seconds"),
            # whether the batch-invariant mode ran (bcg.invariant; null: on with CUDA since session 52)
            "invariant": bool((s.get("invariant") or {}).get("enabled")),
            **pace, **gc_seen, **trace}


def probed(a, argv: list, env: dict, log: Path) -> tuple:
    """(command, env) that runs `python ARGV...`: through benchmarks/probed.py when --gc or --trace asks
    for a probe (the caller has put BENCH_GC_FILE in env; --trace START:SECONDS adds BENCH_TRACE, its
    summary written beside the run's log)."""
    if a.trace:
        start, seconds = a.trace.split(":")
        trace_file = log.with_suffix(".trace.json")
        trace_file.unlink(missing_ok=True)
        env = dict(env, BENCH_TRACE=f"{float(start)}:{float(seconds)}:{trace_file}")
    if a.trace or "BENCH_GC_FILE" in env:
        return [sys.executable, str(ROOT / "benchmarks" / "probed.py"), *argv], env
    return [sys.executable, *argv], env


def trace_report(log: Path) -> dict:
    """--trace: the GPU's window (gpu_trace.py's summary), if the run wrote one."""
    path = log.with_suffix(".trace.json")
    return {"gpu_trace": json.loads(path.read_text())} if path.exists() else {}


def gc_report(path: Path, batches: list, summary: dict, pace: dict) -> dict:
    """--gc: the job's garbage collections over the process and over its generate stage, and the
    seconds of collection inside each of the slowest intervals (added to pace's entries)."""
    from gc_pauses import summarize

    pauses = json.loads(path.read_text())
    t0 = min((e.start for e in batches), default=float("-inf"))  # the generate stage's unix start
    for iv in pace.get("slowest", []):
        iv["gc_s"] = round(sum(p[2] for p in pauses if iv["from_unix"] <= p[0] < iv["to_unix"]), 4)
    return {"gc_process": summarize(pauses),
            "gc_generate": summarize(pauses, t0, t0 + (summary.get("stage_seconds") or {}).get("generate", 0.0))}


def batch_pace(batches: list, slowest: int = 5) -> dict:
    """A job's generate stage from its timeline's entries (jobs/telemetry/timeline.py): the batches handed
    to the sink, the first hand-off (the first unit's captures and first sights in it), the median interval
    between consecutive hand-offs of one part (a steady batch), and what the intervals took beyond it.
    `excess_s` is the net: the intervals' sum less as many steady ones, what the stage lost to anything
    but the steady pace. `above_steady_s` sums only the intervals above the median, so it also holds
    the jitter that the intervals below the median give back: at 1,000 prompts it read 9.4 s where the
    net was 2.0 s (job_wall_h200_1024_1000_s37.md). Also the gross time across a signature switch (a
    unit's drain, a new prefetch thread, a capture), the median interval within each signature (longer
    texts cost more), and the `slowest` intervals with their unix window, to lay against other records
    of the run (--gc's collections, a profile). {} without entries."""
    parts: dict = {}
    for e in batches:
        parts.setdefault((e.part, e.start), []).append(e)
    if not parts:
        return {}
    intervals = []  # (seconds, the hand-off before, the hand-off that ends it), within each part
    for es in parts.values():
        es = sorted(es, key=lambda e: e.t)
        intervals += [(b.t - a.t, a, b) for a, b in zip(es, es[1:])]
    out = {"batches": sum(map(len, parts.values())),
           "first_handoff_s": round(min(e.t for es in parts.values() for e in es), 2)}
    if not intervals:
        return {**out, "batch_interval_s": None, "above_steady_s": None}
    steady = statistics.median(g for g, _, _ in intervals)
    above = sorted(((g - steady, a, b) for g, a, b in intervals if g > steady), key=lambda x: -x[0])
    by_sig: dict = {}
    for g, a, b in intervals:
        if a.signature == b.signature:
            by_sig.setdefault(b.signature, []).append(g)
    return {**out, "batch_interval_s": round(steady, 3),
            "excess_s": round(sum(g for g, _, _ in intervals) - len(intervals) * steady, 2),
            "interval_by_signature_s": {sig: round(statistics.median(gs), 3) for sig, gs in sorted(by_sig.items())},
            "above_steady_s": round(sum(x for x, _, _ in above), 2),
            "switches_above_s": round(sum(x for x, a, b in above if a.signature != b.signature), 2),
            "slowest": [{"t": round(b.t, 2), "above_s": round(x, 3), "switch": a.signature != b.signature,
                         "from_unix": round(a.start + a.t, 3), "to_unix": round(b.start + b.t, 3)}
                        for x, a, b in above[:slowest]]}


def text_length(a) -> int:
    """The text length the plain loop encodes to: SanaPipeline's 300; for Flux the job's T5 length
    (--extra model.max_sequence_length=N, else conf/model/flux.yaml's), passed as max_sequence_length."""
    if a.family == "sana":
        return PIPELINE_TEXT_LEN
    for e in reversed(a.extra):
        if e.startswith("model.max_sequence_length="):
            return int(e.split("=", 1)[1])
    import yaml

    preset = yaml.safe_load((ROOT / "conf" / "model" / f"{a.family}.yaml").read_text())
    return int(preset["model"]["max_sequence_length"])


def run_plain(a, batch: int, compiled: bool, data: Path, env: dict, log: Path) -> dict:
    fam = FAMILIES[a.family]
    call = dict(fam["call"], **({"max_sequence_length": text_length(a)} if a.family == "flux" else {}))
    cmd, env = probed(a, ["-c", PLAIN_LOOP, str(a.dir), str(data), str(a.res), str(a.steps), str(a.guidance),
                          str(batch), "1" if compiled else "0", a.device, fam["pipeline"], json.dumps(call)], env, log)
    start, wall, out = timed(cmd, env, log)
    r = json.loads(next(line for line in out.splitlines() if line.startswith("PLAIN "))[6:])
    sig = f"{a.res}x{a.res}/t{text_length(a)}/s{a.steps}/cfg{a.guidance:g}/bfloat16"
    return {"wall_s": wall, "items": r["items"], "images_per_s": r["images_per_s"], "load_s": r["load_s"],
            "first_batch_s": r["first_batch_unix"] - start, "batch": batch, "signatures": {sig: r["items"]},
            "pipeline": r["pipeline"], **trace_report(log)}


# -- FLOPs --------------------------------------------------------------------------------------
_SIG = re.compile(r"^(\d+)x(\d+)(?:/f\d+)?/t(\d+)/s(\d+)/(?:cfg([\d.]+)|nocfg)/(\w+)$")


def flops_per_image(a, signatures: dict):
    """The mean model FLOPs of an image over a run's signatures ({str(Signature): items}), or None.
    (Flux counts one row a step whatever the signature's cfg: jobs/models/flops/.)"""
    from jobs.models.flops import transformer_flops
    from jobs.plan import Signature

    family = getattr(a, "family", "sana")
    configs = [json.loads((Path(a.dir) / c / "config.json").read_text()) for c in ("transformer", "vae")]
    total = n = 0
    for text, items in signatures.items():
        m = _SIG.match(text)
        if m is None:
            return None
        h, w, t, steps, g, dtype = m.groups()
        sig = Signature(int(h), int(w), int(t), int(steps), float(g or 1.0), g is not None, dtype)
        count = transformer_flops(family, configs[0], configs[1], sig)
        if count is None:
            return None
        total, n = total + count.per_image * items, n + items
    return total / n if n else None


# -- lanes and rows -----------------------------------------------------------------------------
class Results:
    """Every run of every (mode, prompts), written to <out>/job_wall_<tag>.{json,md} after each."""

    def __init__(self, a, meta: dict):
        self.a, self.meta, self.lock = a, meta, threading.Lock()
        self.runs: dict = {}  # (mode, prompts) -> [run dicts]
        self.skipped: dict = {}
        self.bytes: dict = {}  # (mode, prompts) -> the verdict of jobs.verify --against the --bytes-against mode
        self.fpi: dict = {}  # (mode, prompts) -> an earlier JSON's flops_per_image, for a merge without the model

    def resume(self, path: Path) -> int:
        """Take the runs of an earlier call of the same command from its JSON (`--resume`): the device
        lends a machine for 10 minutes a call, so 3 runs of 3 modes of a 12B model span several calls.
        Returns the number of runs taken."""
        if not path.exists():
            return 0
        earlier = json.loads(path.read_text())
        mine = {"family": self.a.family, "steps": self.a.steps, "guidance": self.a.guidance, "commit": self.meta["commit"]}
        theirs = {k: earlier["meta"].get(k) for k in mine}
        theirs["resolution"] = next((r["resolution"] for r in earlier["rows"]), self.a.res)
        mine["resolution"] = self.a.res
        differ = {k: (theirs[k], mine[k]) for k in mine if theirs[k] != mine[k]}
        if differ:  # runs of another setting (or tree) are not more runs of this one
            raise SystemExit(f"--resume: {path} holds runs of another setting: "
                             + ", ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in differ.items())
                             + "; pass another --tag, or leave out --resume")
        # What each earlier call ran, its warm-up above all: the caches the resumed runs found warm
        # were filled there, and this call's own meta would not say so.
        em = earlier["meta"]
        self.meta["earlier_calls"] = em.get("earlier_calls", []) + [
            {k: em.get(k) for k in ("date", "command", "warmup") if em.get(k) is not None}]
        for row in earlier["rows"]:
            for run in row.get("all_runs") or []:
                self.runs.setdefault((row["mode"], row["prompts"]), []).append(run)
            if row.get("flops_per_image"):
                self.fpi[(row["mode"], row["prompts"])] = row["flops_per_image"]
        return sum(map(len, self.runs.values()))

    def add(self, mode: str, prompts: int, run: dict) -> None:
        with self.lock:
            self.runs.setdefault((mode, prompts), []).append(run)
            self.write()

    def skip(self, mode: str, prompts: int, why: str) -> None:
        with self.lock:
            self.skipped.setdefault((mode, prompts), why)
            self.write()

    def picked_batch(self, prompts: int):
        runs = self.runs.get(("bcg", prompts))
        return runs[0]["batch"] if runs else None

    def rows(self) -> list:
        out = []
        order = {m: i for i, m in enumerate(self.a.mode_order)}  # a resumed mode not asked for again: last
        for key in sorted(set(self.runs) | set(self.skipped), key=lambda k: (k[1], order.get(k[0], len(order)), k[0])):
            mode, prompts = key
            runs = self.runs.get(key, [])
            row = {"mode": mode, "resolution": self.a.res, "prompts": prompts, "runs": len(runs),
                   "skipped": self.skipped.get(key)}
            if runs:
                wall = sorted(r["items"] / r["wall_s"] for r in runs)
                gen = [r["images_per_s"] for r in runs if r["images_per_s"]]
                first = [r["first_batch_s"] for r in runs if r["first_batch_s"] is not None]
                fpi = flops_per_image(self.a, runs[0]["signatures"]) if self.a.dir else self.fpi.get(key)
                ips = statistics.median(gen) if gen else None
                tflops = fpi * ips / 1e12 if fpi and ips else None
                row.update(batch=runs[0]["batch"], wall_images_per_s=round(statistics.median(wall), 3),
                           wall_images_per_s_min=round(wall[0], 3), wall_images_per_s_max=round(wall[-1], 3),
                           images_per_s=round(ips, 3) if ips else None,
                           first_batch_s=round(statistics.median(first), 2) if first else None,
                           flops_per_image=fpi, tflops=round(tflops, 1) if tflops else None,
                           peak_fraction=round(tflops / self.peak(), 4) if tflops else None,
                           wall_s=round(statistics.median(r["wall_s"] for r in runs), 1), fixed_s=_fixed(runs),
                           pace_s=_pace(runs),
                           bytes_equal=self.bytes.get(key), all_runs=runs)
            out.append(row)
        return out

    def peak(self) -> float:
        """The dense bf16 peak of the GPU the runs were on (an H100 PCIe board's is not the SXM board's)."""
        from jobs.models.flops.base import peak_by_name

        return peak_by_name(str(self.meta.get("gpu") or "")) or H200_PEAK_TFLOPS

    def write(self) -> None:
        rows = self.rows()
        out = Path(self.a.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"job_wall_{self.a.tag}"
        (out / f"{stem}.json").write_text(json.dumps({"meta": self.meta, "rows": rows}, indent=1, default=str) + "\n")
        title = FAMILIES[self.a.family]["title"]
        lines = [f"# {stem}: {title} size, {self.a.res}², {self.a.steps} steps, CFG {self.a.guidance:g}, "
                 f"process start to exit", "",
                 f"- {self.meta['date']}; commit `{self.meta['commit']}`; {self.meta['gpu']}, torch {self.meta['torch']}",
                 f"- command: `{self.meta['command']}`",
                 f"- caches: {self.a.cache} (Triton/Inductor/bcgen); page cache warmed by reading the model folder once; "
                 + _lanes(self.meta),
                 *[f"- merged (merge_job_wall.py): {m['date']}, `{m['command']}`" for m in self.meta.get("merged", [])],
                 *[f"- resumed from (--resume): {c.get('date')}, `{c.get('command')}`"
                   + (f"; warm-up {c['warmup']}" if c.get("warmup") else "") for c in self.meta.get("earlier_calls", [])],
                 *([f"- warm-up (--warmup): {self.meta['warmup']}"] if self.meta.get("warmup") else []),
                 "",
                 "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for r in rows:
            lines.append("| " + " | ".join("—" if r.get(c) is None else str(r.get(c)) for c in COLUMNS) + " |")
        lines += ["", "wall_images_per_s: items / (exit - start) of each run, median [min, max]; images_per_s: the "
                      "generation stage (the job's summary; the plain loop's batches after its first); first_batch_s: "
                      "process start to the first batch out of the decoder; tflops: images_per_s x the model FLOPs of "
                      "an image at that mode's text lengths (jobs/models/flops/); peak_fraction: of "
                      f"{self.peak():g} TFLOP/s, the GPU's dense bf16 peak; "
                      "pace_s (the job's timeline, medians): steady, the interval between two batches of one part; "
                      "first, the generate stage's start to its first batch handed to the sink (its captures and "
                      "first sights), with that batch's device time by stage; switches, what the signature switches "
                      "took above the steady pace; fixed_s (medians): the job's start-up (process start to the plan, "
                      "by part), plan, load (by part) and batch sizing."]
        if self.a.family == "flux":
            lines += ["", f"Flux.1-dev (random weights, FLUX.1-dev's configs; T5 and CLIP vocabularies cut to "
                          f"MiniLM's 30,522): the job is model=flux, plainN FluxPipeline with max_sequence_length "
                          f"{text_length(self.a)}; guidance {self.a.guidance:g} is the distilled guidance embedding, "
                          f"no negative branch, so FLOPs count one transformer row per step."]
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def _lanes(meta: dict) -> str:
    """How the runs were laid on the GPUs, for the table's header."""
    if meta.get("lanes_take") == "runs":
        return (f"lanes (--lanes runs: each GPU took the next run of any mode, so runs went side by side): "
                f"{', '.join(meta['lanes'])}")
    return f"lanes (GPU: what it runs, one run at a time): {meta.get('lanes')}"


def _fixed(runs: list) -> str:
    """The fixed costs of a mode, medians: the job's start-up, plan, load and batch sizing; the plain
    loop's load."""
    names = ("startup", "plan", "load", "batch_sizing")
    parts = []
    for name in names:
        v = [r["stage_seconds"][name] for r in runs if name in r.get("stage_seconds", {})]
        if name == "load" and not v:
            v = [r["load_s"] for r in runs if "load_s" in r]
        if v:
            parts.append(f"{name} {statistics.median(v):.1f}" + _stage_parts(runs, name))
    return ", ".join(parts)


def _stage_parts(runs: list, stage: str) -> str:
    """" (imports 6.1, weights 0.5, to_device 1.4)": the job's load stage or start-up by part (summary.json's
    load_seconds, startup_seconds), medians over the runs that have them; "" for another stage."""
    from jobs.telemetry.startup import STARTUP_PART_ORDER
    from jobs.telemetry.summary import LOAD_PART_ORDER, parts_text

    if stage not in ("load", "startup"):
        return ""
    key, order = ("load_seconds", LOAD_PART_ORDER) if stage == "load" else ("startup_seconds", STARTUP_PART_ORDER)
    kept = [r[key] for r in runs if r.get(key)]
    names = {n for parts in kept for n in parts}
    return parts_text({n: statistics.median(p[n] for p in kept if n in p) for n in names}, order, unit="")


def _pace(runs: list) -> str:
    """A mode's pace from its runs' timelines (batch_pace), medians: the steady interval, the first hand-off
    (with its batch's device time by stage, summary.json's first_batch_ms: the rest of it is the host's)
    and the switches' time above the steady pace. Apart, they say whether a cost is paid per batch or once a
    run. Empty for the plain loop (no timeline)."""
    parts = []
    for name, label, digits in (("batch_interval_s", "steady", 3), ("first_handoff_s", "first", 2),
                                ("switches_above_s", "switches", 2)):
        v = [r[name] for r in runs if r.get(name) is not None]
        if v:
            device = _first_device(runs) if label == "first" else ""
            parts.append(f"{label} {statistics.median(v):.{digits}f}{device}")
    return ", ".join(parts)


def _first_device(runs: list) -> str:
    """" (device: encode 0.10, denoise 0.60, decode 0.20)": the first batch's device seconds by stage, medians."""
    from jobs.telemetry.summary import DEVICE_STAGE_ORDER

    kept = [r["first_batch_ms"] for r in runs if r.get("first_batch_ms")]
    stages = [s for s in DEVICE_STAGE_ORDER if any(s in k for k in kept)]
    shown = [f"{s} {statistics.median(k[s] for k in kept if s in k) / 1e3:.2f}" for s in stages]
    return f" (device: {', '.join(shown)})" if shown else ""


def one_run(a, mode: str, prompts: int, data: Path, gpu, i: int, results: Results) -> None:
    cache = a.work / ("cache" if a.cache == "warm" else f"cache-{mode}-{prompts}-{i}")
    env = child_env(gpu, cache)
    log = a.work / f"{mode}-{prompts}-{i}.log"
    if mode.startswith("plain"):
        m = re.fullmatch(r"plain(\d+|-picked)(-compile)?", mode)
        batch = results.picked_batch(prompts) if m.group(1) == "-picked" else int(m.group(1))
        run = run_plain(a, batch, bool(m.group(2)), data, env, log)
    else:
        run = run_job(a, mode, data, job_out(a, mode, prompts, i), env, log)
    run["gpu"] = gpu  # with --lanes runs, a mode's runs went to several
    results.add(mode, prompts, run)
    print(f"[gpu {gpu}] {mode} {prompts} prompts run {i + 1}: {run['items'] / run['wall_s']:.3f} images/s wall "
          f"({run['wall_s']:.1f} s), {run['images_per_s']} generating, first batch {run['first_batch_s']:.1f} s",
          flush=True)


def warm_up(a, gpu) -> dict:
    """--warmup N: each mode once on N prompts in --work's shared cache, untimed and not a result, before
    the timed runs: on a fresh machine a job's first run compiles every fused kernel and verifies it on
    first sight (a 1,000-prompt run's first batch came 10 s later, session 41's `_s41cold`), and a compiled
    loop's first run compiles. The plain eager loop has nothing to warm. Unprofiled: --trace, --gc and
    --pyspy are for the timed runs. Returns each mode's wall seconds, or its error."""
    plain = argparse.Namespace(**{**vars(a), "trace": None, "gc": False})
    env = child_env(gpu, a.work / "cache")
    data = spread_prompts(a, max(a.datasets)[1], a.warmup, env)
    spy = os.environ.pop("BENCH_PYSPY_DIR", None)  # read by timed(); no lane runs yet
    done: dict = {}
    try:
        for mode in a.mode_order:
            if re.fullmatch(r"plain(\d+|-picked)", mode):
                continue
            log = a.work / f"warmup-{mode}.log"
            compiled = re.fullmatch(r"plain(\d+)-compile", mode)
            if mode.startswith("plain") and not compiled:  # plain-picked-compile: bcg's pick, not known yet
                done[mode] = "skipped: its batch is the one bcg picks in the timed runs"
                continue
            try:
                if compiled:
                    run = run_plain(plain, int(compiled.group(1)), True, data, env, log)
                else:
                    run = run_job(plain, mode, data, a.work / f"out-warmup-{mode}", env, log)
                done[mode] = round(run["wall_s"], 1)
            except RuntimeError as e:  # the timed runs will say it again, as a row
                done[mode] = f"error: {str(e).splitlines()[0][:200]}"
            print(f"[gpu {gpu}] warm-up {mode}, {a.warmup} prompts: {done[mode]}", flush=True)
    finally:
        if spy is not None:
            os.environ["BENCH_PYSPY_DIR"] = spy
    return done


def job_overrides(a, data: Path, out: Path) -> list:
    """What `jobs.generate` (and `jobs.plan`) are given for `data` into `out`, before the mode's own."""
    return [f"model={a.family}", f"model.path={a.dir}", f"dataset.path={data}", f"output_dir={out}",
            f"sampling.height={a.res}", f"sampling.width={a.res}", f"sampling.steps={a.steps}",
            f"sampling.guidance_scale={a.guidance}"]


def spread_prompts(a, timed: Path, n: int, env: dict) -> Path:
    """n prompts of the timed set `timed` that meet every signature the job plans it into, for the warm-up:
    the first n prompts met one of SANA's four text buckets at 1,000 prompts (session 53), so three buckets
    compiled and verified their kernels inside the timed run (11 s above the steady pace) where a user's
    second run has them all warm. The job's own planner cuts the timed set (`python -m jobs.plan`), then
    each unit gives an equal share, n // units, at least one prompt (so a plan of more units than n
    gives one a unit, more than n in all), or all its prompts where it has fewer."""
    from jobs.output.layout import PLAN_DIR
    from jobs.plan.units import read_manifest, read_unit_keys

    out = a.work / "warmup-plan"
    shutil.rmtree(out, ignore_errors=True)
    log = a.work / "warmup-plan.log"
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "jobs.plan", *job_overrides(a, timed, out), *a.extra],
                              cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"jobs.plan for the warm-up's prompts exited {done.returncode}: see {log}")
    plan_dir = out / PLAN_DIR
    units = read_manifest(plan_dir).units
    share = max(1, n // max(1, len(units)))
    keys = {k for u in units for k in read_unit_keys(plan_dir, u)[:share]}
    rows = [line for line in timed.read_text().splitlines() if line.strip() and json.loads(line)["key"] in keys]
    path = a.work / f"prompts_warmup_{n}.jsonl"
    path.write_text("".join(r + "\n" for r in rows))
    return path


def job_out(a, mode: str, prompts: int, i: int) -> Path:
    """A job run's output_dir: one a mode, each run replacing the last, where a mode's runs are in series;
    one a run where they may go on at once (--lanes runs)."""
    return a.work / (f"out-{mode}-{prompts}" + (f"-{i}" if a.lanes == "runs" else ""))


def last_out(a, mode: str, prompts: int):
    """The output_dir of a mode's last finished job run (for --bytes-against), or None."""
    name = re.compile(rf"out-{re.escape(mode)}-{prompts}(-\d+)?")
    done = [p / "summary.json" for p in a.work.iterdir() if name.fullmatch(p.name)]
    done = [s for s in done if s.exists()]
    return max(done, key=lambda s: s.stat().st_mtime_ns).parent if done else None


class RunList:
    """The runs left for one lane (--lanes modes: its own modes) or for every lane (--lanes runs),
    taken in order by whichever lane is free: (prompts, data, run index, mode)."""

    def __init__(self, a, modes: list, results: Results):
        modes = sorted(modes, key=lambda m: m != "bcg")  # plain-picked waits for bcg's first run: bcg first
        self.items: Deque[tuple] = deque(
            (prompts, data, i, mode) for prompts, data in a.datasets for i in range(a.runs) for mode in modes
            # not those done in an earlier call (--resume), nor again a mode run once (--once)
            if len(results.runs.get((mode, prompts), [])) <= i and not (i and mode in a.once))
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            return self.items.popleft() if self.items else None


def lane(a, runs: RunList, gpu, results: Results, t_start: float, bcg_done: threading.Event, last: dict) -> None:
    """Take runs off `runs` until none is left, each on `gpu`. `last`: each (mode, prompts)'s last wall
    seconds, shared by the lanes, for the budget's estimates."""
    while (item := runs.take()) is not None:
        prompts, data, i, mode = item
        if mode == "plain-picked":
            bcg_done.wait()
            picked = results.picked_batch(prompts)
            if picked is None or f"plain{picked}" in a.mode_order:
                results.skip(mode, prompts, "no bcg run in this call" if picked is None
                             else f"bcg picked {picked}: the same as plain{picked}")
                continue
        if (mode, prompts) in results.skipped:
            continue
        left = a.budget_s - (time.perf_counter() - t_start)
        if left < _estimate(last, mode, prompts) * 1.1:
            results.skip(mode, prompts, f"budget: {left:.0f} s left of --budget-s {a.budget_s:.0f} after "
                                        f"{len(results.runs.get((mode, prompts), []))} run(s)")
            continue
        t0 = time.perf_counter()
        try:
            one_run(a, mode, prompts, data, gpu, i, results)
        except RuntimeError as e:  # a failing mode is a row, not a crash of the others
            results.skip(mode, prompts, f"error: {str(e).splitlines()[0][:300]}")
        finally:
            if mode == "bcg":
                bcg_done.set()
        last[(mode, prompts)] = time.perf_counter() - t0
    bcg_done.set()  # a lane without bcg never holds the others


def _estimate(last: dict, mode: str, prompts: int) -> float:
    """Seconds the next run of (mode, prompts) should take: its last run, else a smaller count's
    last run scaled by the prompts (fixed costs scaled too: an overestimate), else the slowest other
    mode's last run at this count (a first run of a 12B model must not start with too little left
    of a device call), else 0 (run it)."""
    if (mode, prompts) in last:
        return last[(mode, prompts)]
    smaller = [(n, s) for (m, n), s in last.items() if m == mode and n < prompts]
    if smaller:
        return max(smaller)[1] * prompts / max(smaller)[0]
    return max((s for (m, n), s in last.items() if n == prompts), default=0.0)


def compare_bytes(a, results: Results) -> None:
    """Each job mode's last output against --bytes-against's, key by key (jobs/output/compare.py):
    'N/N identical' or what differs, into its row as bytes_equal."""
    from jobs.output.compare import compare_outputs

    for prompts, _ in a.datasets:
        there = last_out(a, a.bytes_against, prompts)
        for mode in a.mode_order:
            here = last_out(a, mode, prompts)
            if mode == a.bytes_against or mode.startswith("plain") or here is None:
                continue
            if there is None:
                results.bytes[(mode, prompts)] = f"no {a.bytes_against} output to compare with"
                continue
            c = compare_outputs(here, there)
            results.bytes[(mode, prompts)] = (f"{len(c.identical)}/{len(c.identical)} identical" if c.same
                                              else c.verdict())
            print(f"bytes, {mode} against {a.bytes_against} at {prompts} prompts: {results.bytes[(mode, prompts)]}",
                  flush=True)


def write_prompts(path: Path, n: int) -> Path:
    """The first n realistic prompts (510), cycled with distinct keys beyond."""
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({"key": f"w{i:06d}", "prompt": texts[i % len(texts)]}) + "\n"
                            for i in range(n)))
    return path


def warm_page_cache(folder: Path) -> float:
    t0 = time.perf_counter()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass
    return time.perf_counter() - t0


def build(a) -> None:
    if (Path(a.dir) / "model_index.json").exists():
        return
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_job_realsize.py"), "build", "--dir", str(a.dir),
           "--tokenizer", a.tokenizer, *(["--family", a.family] if a.family != "sana" else []),
           *(["--tiny"] if a.tiny else [])]
    subprocess.run(cmd, cwd=ROOT, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="sana",
                   help="sana: SANA-1.6B (default); flux: Flux.1-dev (model=flux against a FluxPipeline loop)")
    p.add_argument("--dir", type=Path, required=True, help="the real-size folder (made with --build if missing)")
    p.add_argument("--build", action="store_true", help="build the folder first if it is missing")
    p.add_argument("--tokenizer", default=str(ROOT / ".minilm"), help="for --build: the offline MiniLM tokenizer")
    p.add_argument("--res", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=None, help="default: the family's (SANA 4.5, Flux 3.5)")
    p.add_argument("--prompts", default="200", help="comma list of prompt counts, e.g. 200,1000,5000")
    p.add_argument("--modes", default="bcg,plain8,plain8-compile")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gpus", default="0", help="GPU lanes, e.g. 0,1,2; 'none' for --device cpu (none,none: two "
                                              "lanes on the CPU)")
    p.add_argument("--lanes", choices=["modes", "runs"], default="modes",
                   help="modes: each lane its own modes (round robin), their runs in series; runs: every lane takes "
                        "the next run of one shared list, so runs of a mode go on at once on several GPUs")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (tiny folder)")
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                   help="--build a narrow folder of the same classes (default: with --device cpu)")
    p.add_argument("--cache", choices=["warm", "cold"], default="warm")
    p.add_argument("--budget-s", type=float, default=480, help="no run starts that would end after this")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every job mode")
    p.add_argument("--work", type=Path, default=Path("/tmp/bcgen-wall"))
    p.add_argument("--tag", default=None, help="result file job_wall_<tag> (default: the GPU, e.g. h200; "
                                               "job_wall_flux_<tag> for --family flux)")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="first run each job and compiled mode once on N prompts (a share of each planned unit of the "
                        "largest --prompts set: every text bucket), untimed, in --work's cache "
                        "(Triton, Inductor, the fused kernels' verdicts): a fresh machine's first run is a "
                        "cold one. Needs --cache warm")
    p.add_argument("--resume", action="store_true",
                   help="keep --work (its output folders and caches) and the runs already in --out's JSON of this tag; "
                        "run only the runs missing up to --runs (a benchmark spread over several device calls)")
    p.add_argument("--once", default="", help="comma list of modes run once, not --runs times (a bytes reference such "
                                              "as off, where device time is short)")
    p.add_argument("--bytes-against", default=None, metavar="MODE",
                   help="after the runs, compare each other job mode's last output with MODE's, key by key "
                        "(jobs.verify --against: latent_sha256 and every member's bytes), e.g. off")
    p.add_argument("--pyspy", type=Path, default=None, help="profile every run with py-spy into this folder "
                                                           "(stacks and logs; its timings are not results)")
    p.add_argument("--pyspy-format", choices=["raw", "speedscope"], default="raw")
    p.add_argument("--gc", action="store_true", help="record each job run's garbage collections (gc_pauses.py): "
                                                     "their seconds in the generate stage and in its slowest intervals")
    p.add_argument("--trace", default=None, metavar="START:SECONDS",
                   help="trace the GPU (kernels, copies, clocks: gpu_trace.py) from START to START + SECONDS after each "
                        "run's start, job and plain loop; the summary goes into the run's JSON (a probe: the traced "
                        "runs' timings are not results)")
    a = p.parse_args()
    a.guidance = FAMILIES[a.family]["guidance"] if a.guidance is None else a.guidance
    a.tiny = a.device == "cpu" if a.tiny is None else a.tiny
    if a.pyspy:
        a.pyspy.mkdir(parents=True, exist_ok=True)
        os.environ.update(BENCH_PYSPY_DIR=str(a.pyspy), BENCH_PYSPY_FORMAT=a.pyspy_format)
    t_start = time.perf_counter()
    a.mode_order = a.modes.split(",")
    a.once = set(filter(None, a.once.split(",")))
    for m in a.mode_order:
        if not (m in JOB_MODES or m == "bcg" or re.fullmatch(r"plain(\d+|-picked)(-compile)?", m)):
            raise SystemExit(f"--modes: unknown mode {m!r}; use bcg, {', '.join(JOB_MODES)}, plainN, plain-picked, "
                             f"plainN-compile")
    if a.warmup and a.cache != "warm":
        raise SystemExit(f"--warmup {a.warmup} fills the shared cache that --cache warm gives the runs; with "
                         "--cache cold each run starts empty: leave out --warmup")
    if not a.resume:
        shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True, exist_ok=True)
    build(a)
    warm_s = warm_page_cache(Path(a.dir))
    a.datasets = [(n, write_prompts(a.work / f"prompts_{n}.jsonl", n)) for n in map(int, a.prompts.split(","))]
    import torch

    from common import commit, device_tag, environment

    meta = environment()
    meta.update(commit=commit(),
                family=a.family, page_cache_warm_s=round(warm_s, 1), cache=a.cache, steps=a.steps, guidance=a.guidance,
                gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    a.tag = a.tag or device_tag()
    if a.family != "sana":  # never over SANA's results of the same tag: job_wall_flux_<tag>
        a.tag = f"{a.family}_{a.tag}"
    results = Results(a, meta)
    if a.resume:
        meta["resumed_runs"] = results.resume(Path(a.out) / f"job_wall_{a.tag}.json")
    gpus = [None if g == "none" else g for g in a.gpus.split(",")]
    if a.warmup:
        meta["warmup"] = {"prompts": a.warmup, "wall_s": warm_up(a, gpus[0])}
    names = [f"cpu{k}" if g is None else str(g) for k, g in enumerate(gpus)]
    meta["lanes_take"] = a.lanes
    if a.lanes == "runs":  # one list: each GPU takes the next run when free
        shared = RunList(a, a.mode_order, results)
        lanes = [(shared, g) for g in gpus]
        meta["lanes"] = {name: list(a.mode_order) for name in names}
    else:
        modes = [a.mode_order[i::len(gpus)] for i in range(len(gpus))]
        lanes = [(RunList(a, m, results), g) for m, g in zip(modes, gpus) if m]
        meta["lanes"] = {name: m for m, name in zip(modes, names) if m}
    bcg_done = threading.Event()
    if "bcg" not in a.mode_order or any(m == "bcg" for m, _ in results.runs):
        bcg_done.set()
    last: dict = {key: runs[-1]["wall_s"] for key, runs in results.runs.items()}  # an earlier call's (--resume)
    threads = [threading.Thread(target=lane, args=(a, runs, g, results, t_start, bcg_done, last))
               for runs, g in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if a.bytes_against:
        compare_bytes(a, results)
    results.write()
    print((Path(a.out) / f"job_wall_{a.tag}.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
