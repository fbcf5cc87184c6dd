"""Where the model load goes, and what loading straight onto the GPU saves (issue 28's first batch).

The job's first batch waits for the model load: 9.4 s at SANA-1.6B size on the H200 against the
plain loop's 6.7 s (job_wall_h200_512_1000_s32.md). This probe times, each variant in a fresh
process (imports done before the clock starts), alternated, `--reps` times:

    to           Pipeline.from_pretrained(dir, dtype) then .to("cuda"): the plain loop's load
    device_map   Pipeline.from_pretrained(dir, dtype, device_map="cuda"): each tensor is read
                 from the safetensors file straight into device memory
    job          the job's own load, its "load" stage: the composed config, `load_pipeline`,
                 `attach_runner` and `attach_decoder_fusions` (jobs/worker/model.py), split into
                 its parts (`family_load`: from_pretrained and prepare; `to_device`: the rest of
                 load_pipeline, the copy to the GPU). Session 40 measured 4.9-6.1 s here against
                 7.1-7.7 s in the job's own stage, on one machine, before `decoder_fusions` was a part
    job_trainable  the same with the weights left trainable (eval mode only): whether `a39461b`'s
                 frozen weights move the load (session 39's first batch came later; not explained)

Every variant reports a checksum of every parameter's bytes, so a faster load is also the same
weights.

    python benchmarks/probe_load.py --dir /tmp/sana16 --reps 3 --out benchmarks/results
    python benchmarks/probe_load.py --dir /tmp/tiny --device cpu --reps 1 --out /tmp/probe   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

CHILD = r'''
import json, sys, time
variant, path, device, pipeline = sys.argv[1:]
t_imp = time.perf_counter()
import torch
import diffusers
imports = time.perf_counter() - t_imp
dtype = torch.bfloat16 if device == "cuda" else torch.float32
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
parts = {}
t0 = time.perf_counter()
if variant in ("job", "job_trainable"):
    sys.path.insert(0, ".")
    from tests.helpers import compose_cfg
    from jobs.models.registry import get_family
    from jobs.worker.model import attach_decoder_fusions, attach_runner, load_pipeline
    import jobs.models.weights as weights
    if variant == "job_trainable":  # eval mode only, the weights left trainable (as before a39461b)
        weights.eval_mode = lambda pipe: [m.eval() for m in weights.torch_modules(pipe).values()]
    cfg = compose_cfg(["model=sana", f"model.path={path}", "output_dir=/tmp/probe_load_out", f"device={device}"])
    fam = get_family(cfg.model.family)
    parts["config"] = time.perf_counter() - t0
    family_load = fam.load

    def timed_load(*args, **kwargs):  # from_pretrained and prepare, inside load_pipeline
        t = time.perf_counter()
        out = family_load(*args, **kwargs)
        parts["family_load"] = time.perf_counter() - t
        return out

    fam.load = timed_load
    t = time.perf_counter()
    pipe = load_pipeline(fam, cfg, torch.device(device))
    sync()
    parts["load_pipeline"] = time.perf_counter() - t
    parts["to_device"] = parts["load_pipeline"] - parts["family_load"]
    parts["trainable_parameters"] = sum(p.requires_grad for m in weights.torch_modules(pipe).values()
                                        for p in m.parameters())
    t = time.perf_counter()
    attach_runner(fam, pipe, cfg)
    sync()
    parts["attach_runner"] = time.perf_counter() - t
    t = time.perf_counter()  # the last part of the job's "load" stage (jobs/worker/loop.py's _load)
    attach_decoder_fusions(pipe, cfg, torch.device(device))
    sync()
    parts["decoder_fusions"] = time.perf_counter() - t
else:
    cls = getattr(diffusers, pipeline)
    extra = {"device_map": device} if variant == "device_map" else {}
    pipe = cls.from_pretrained(path, torch_dtype=dtype, local_files_only=True, **extra)
    sync()
    parts["from_pretrained"] = time.perf_counter() - t0
    if variant == "to":
        t = time.perf_counter()
        pipe = pipe.to(device)
        sync()
        parts["to"] = time.perf_counter() - t
total = time.perf_counter() - t0
check = {}
for name, m in pipe.components.items():
    if isinstance(m, torch.nn.Module):
        s = 0
        for p in list(m.parameters()) + list(m.buffers()):
            s += int(p.detach().contiguous().view(-1).view(torch.uint8).to(torch.int64).sum())
        check[name] = [s, str(next(m.parameters()).device)]
print("LOAD " + json.dumps({"variant": variant, "imports_s": round(imports, 2), "load_s": round(total, 2),
                           "parts": {k: round(v, 2) for k, v in parts.items()}, "checksum": check}))
'''

VARIANTS = ("to", "device_map", "job", "job_trainable")


def run(variant: str, a) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, str(a.dir), a.device, a.pipeline], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{variant} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("LOAD "))[5:])
    r["process_s"] = round(time.perf_counter() - t0, 2)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, required=True, help="a saved pipeline folder (bench_job_realsize.py build)")
    p.add_argument("--pipeline", default="SanaPipeline")
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", default="", help="the results' file stem after load_ (default: the device)")
    p.add_argument("--from-log", type=Path, help="write the results from a run's printed lines (no loading)")
    p.add_argument("--commit", default="unknown", help="with --from-log: the commit that run measured")
    p.add_argument("--gpu", default="unknown", help="with --from-log: the GPU it ran on")
    p.add_argument("--torch", default="unknown", help="with --from-log: its torch version")
    p.add_argument("--ran", default="unknown", help="with --from-log: the command that printed the log")
    a = p.parse_args()
    from bench_job_wall import warm_page_cache

    variants = a.variants.split(",")
    if a.from_log:  # a device call's files can be left out; its log holds every run's line
        runs = {v: [] for v in variants}
        for r in (json.loads(line) for line in a.from_log.read_text().splitlines() if line.startswith("{")):
            if r.get("variant") in runs:
                runs[r["variant"]].append(r)
        # the table's machine is the run's, not this one's: named from the flags, the log's path kept
        ran = {"gpu": a.gpu, "torch": a.torch, "cuda": None, "command": a.ran, "rebuilt_from": str(a.from_log)}
        write(a, runs, "page cache warmed first", a.commit, ran)
        return
    warm_s = warm_page_cache(a.dir)
    runs = {v: [] for v in variants}
    for _ in range(a.reps):
        for v in variants:
            runs[v].append(run(v, a))
            print(json.dumps(runs[v][-1]), flush=True)
    from common import commit

    write(a, runs, f"page cache warmed first ({warm_s:.1f} s)", commit(), {})


def write(a, runs: dict[str, list[dict]], warm: str, commit: str, ran: dict) -> None:
    """Each variant's median, min and max load and its parts' medians, to load_<tag>.{json,md}."""
    from common import device_tag, environment, write_results

    variants = list(runs)
    sums = {v: json.dumps({k: c[0] for k, c in rs[0]["checksum"].items()}, sort_keys=True) for v, rs in runs.items()}
    rows = []
    for v, rs in runs.items():
        loads = [r["load_s"] for r in rs]
        parts = {k: round(statistics.median(r["parts"][k] for r in rs), 2) for k in rs[0]["parts"]}
        rows.append({"variant": v, "runs": len(rs), "load_s": round(statistics.median(loads), 2),
                     "load_s_min": min(loads), "load_s_max": max(loads),
                     "imports_s": round(statistics.median(r["imports_s"] for r in rs), 2),
                     "parts": ", ".join(f"{k} {s}" for k, s in parts.items()),
                     "same_weights": sums[v] == sums[variants[0]]})
    cols = ["variant", "runs", "load_s", "load_s_min", "load_s_max", "imports_s", "parts", "same_weights"]
    notes = [f"{warm}; each run a fresh process, variants alternated; "
             "load_s: from the first from_pretrained call to the weights on the device (synchronised), "
             "imports before it; "
             "same_weights: every parameter's and buffer's byte sum equals the first variant's"]
    meta = environment() | ran | {"commit": commit}
    notes.append(f"commit `{commit}`")
    if ran:
        notes.append(f"written here from the run's printed lines ({ran['rebuilt_from']}); the machine, command "
                     "and commit are the run's")
    write_results(a.out, f"load_{a.tag or device_tag()}", rows, cols, notes=notes, meta=meta)


if __name__ == "__main__":
    main()
