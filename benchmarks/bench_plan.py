"""Planning at scale on the CPU: `python -m jobs.plan` over 1M and 10M synthetic prompts, and what a
worker pays to join such a plan.

    python benchmarks/bench_plan.py --sizes 1000000,10000000 --out benchmarks/results --data /tmp/bench_plan

For each size it writes a JSONL of synthetic captions (distinct prompts: two fragments drawn from
200k-word-ish pools, a row number; 2% carry non-ASCII words, which take the tokenizer's slow path;
10% ask for another size, so there are several signatures), runs the real planner CLI in a
subprocess and samples the RSS of its whole process tree (main + tokenizing processes) every
0.1 s. Then it starts a worker probe in a fresh interpreter: everything `jobs.generate` does before
loading the model (config, join the plan, lease a unit, read it, cut the first batch); its
start-up time and peak RSS are compared between sizes (the model load is the same for any plan).

Besides the CLI's wall clock (interpreter start and imports included: ~9 CPU-s of torch,
transformers and hydra before the first row) it records plan_dataset's own rate (its log line)
and the CPU seconds of the planner's whole process tree (getrusage of the waited-for children):
on a 2-core machine shared with other sessions, prompts per CPU-second is the number that does
not depend on how busy the others keep the cores.

Targets (issue 11, 2 cores): >= 50k prompts/s with the tiny preset's tokenizer; planner peak RSS
<= 1.5 GB at 10M; worker RSS and start-up within 10% between 1M and 10M.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_plan")

WORKER_PROBE = r"""
import sys, time
t0 = time.perf_counter()
from tests.helpers import compose_cfg
from jobs.worker.ranks import Group, Topology
from jobs.worker.prepare import prepare
from jobs.telemetry.summary import StageTimer
import torch
cfg = compose_cfg(sys.argv[1:])
prep = prepare(cfg, StageTimer(), Group(Topology(), torch.device("cpu"), 1.0), torch.device("cpu"))
batch = next(prep.plan.units())[0]
ready = time.perf_counter() - t0
# VmHWM, not ru_maxrss: Linux carries the forking parent's RSS into a child's ru_maxrss across exec.
rss = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
prep.sink.abort()
print("PROBE", ready, rss, len(batch.items), prep.plan.leased[0])
"""


def write_prompts(path: Path, n: int, seed: int = 0) -> None:
    import numpy as np

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["a", "the", "of", "in", "with", "and", "on", "photo", "painting", "light", "portrait", "city", "night",
             "red", "blue", "old", "small", "misty", "forest", "river", "castle", "cat", "dog", "woman", "man"]
    vocab += ["".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(20000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]  # Zipf-like: a few words are most of the text
    frags = [" ".join(rng.choices(vocab, weights, k=rng.randint(3, 18))) for _ in range(4096)]
    exotic = [f + " café naïve" for f in frags[:64]]
    gen = np.random.default_rng(seed)
    with open(path, "w") as f:
        for start in range(0, n, 1 << 20):
            m = min(1 << 20, n - start)
            r = gen.random(m)
            a_idx, b_idx = gen.integers(0, 4096, m).tolist(), gen.integers(0, 4096, m).tolist()
            lines = []
            for j in range(m):
                i = start + j
                a = exotic[i % 64] if r[j] < 0.02 else frags[a_idx[j]]
                size = ', "width": 768' if r[j] > 0.9 else ""
                lines.append(f'{{"key": "k{i:010d}", "prompt": "{a}, {frags[b_idx[j]]}, {i}"{size}}}\n')
            f.write("".join(lines))


def tokenizer_baseline(path: Path, sample: int = 20000) -> float:
    """The preset's own batched fast tokenizer on the first `sample` prompts, in this process,
    prompts/s: the machine's speed at the moment, to read the planner's number against."""
    from jobs.models.text_encoders import load_tokenizer

    with open(path) as f:
        texts = [json.loads(next(f))["prompt"].lower().strip() for _ in range(sample)]
    tok = load_tokenizer("minilm")
    t0 = time.perf_counter()
    tok(texts, add_special_tokens=True)
    return sample / (time.perf_counter() - t0)


def tree_rss(pid: int) -> int:
    """RSS of a process and its descendants, from /proc (bytes)."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def run_planner(args: list, env: dict) -> dict:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jobs.plan", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    out = proc.stdout.read()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"planner failed ({proc.returncode}):\n{out[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the planner and its pool (waited for)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    inner = re.search(r"plan: (\d+) rows -> .*?, ([\d.]+)s \(", out)  # plan_dataset's own line
    return {"wall_s": wall, "cpu_s": cpu, "plan_dataset_s": float(inner.group(2)) if inner else None,
            "peak_tree_rss_bytes": peak, "log_tail": out.strip().splitlines()[-8:]}


def run_probe(args: list, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER_PROBE, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("PROBE"))
    _, ready, rss, n, unit = line.split()
    return {"startup_s": float(ready), "peak_rss_bytes": int(rss), "first_batch_items": int(n), "unit": int(unit)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--data", default="/tmp/bench_plan", help="scratch folder for prompts and plans")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--unit-items", type=int, default=5000)
    p.add_argument("--probes", type=int, default=3, help="worker probes per size (the median is kept)")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    data = Path(a.data)
    data.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
               HYDRA_FULL_ERROR="1",
               BCGEN_ALLOW_HYDRA_PATHS="1")  # its hydra.run.dir keeps the logs out of the timed output_dir
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        prompts = data / f"prompts_{n}.jsonl"
        if not prompts.exists():
            t0 = time.perf_counter()
            write_prompts(prompts, n)
            log.info("wrote %s (%d rows, %.0f MB) in %.0fs", prompts, n, prompts.stat().st_size / 1e6,
                     time.perf_counter() - t0)
        out_dir = data / f"run_{n}"
        subprocess.run(["rm", "-rf", str(out_dir)], check=True)
        cfg = [f"dataset.path={prompts}", f"output_dir={out_dir}", f"plan.unit_items={a.unit_items}",
               "hydra.run.dir=" + str(data / "hydra")]
        baseline = tokenizer_baseline(prompts)
        load = os.getloadavg()[0]
        planner = run_planner(cfg, env)
        plan = json.loads((out_dir / "_plan" / "plan.json").read_text())
        probes = sorted((run_probe([c for c in cfg if not c.startswith("hydra.")], env) for _ in range(a.probes)),
                        key=lambda r: r["startup_s"])
        row = {"prompts": n, "dataset_mb": round(prompts.stat().st_size / 1e6, 1),
               "plan_s": round(planner["wall_s"], 2), "prompts_per_s": round(n / planner["wall_s"]),
               "plan_dataset_s": planner["plan_dataset_s"],
               "plan_dataset_prompts_per_s": round(n / planner["plan_dataset_s"]) if planner["plan_dataset_s"] else None,
               "planner_cpu_s": round(planner["cpu_s"], 1),
               "prompts_per_cpu_s": round(n / planner["cpu_s"]),
               "planner_peak_rss_mb": round(planner["peak_tree_rss_bytes"] / 2**20),
               "units": len(plan["units"]), "signatures": len(plan["signatures"]),
               "plan_json_kb": round((out_dir / "_plan" / "plan.json").stat().st_size / 1024),
               "worker_startup_s": round(probes[len(probes) // 2]["startup_s"], 3),
               "worker_peak_rss_mb": round(probes[len(probes) // 2]["peak_rss_bytes"] / 2**20, 1),
               "worker_startup_all_s": [round(r["startup_s"], 3) for r in probes],
               "hf_tokenizer_prompts_per_s_1_process": round(baseline),
               "load_avg_1m_before": round(load, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "planner_log": planner["log_tail"]}
        log.info("%s", {k: v for k, v in row.items() if k != "planner_log"})
        rows.append(row)
        write_results(Path(a.out), rows, " ".join(sys.argv))  # after each size: a long run keeps what it measured


def write_results(out: Path, rows: list, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (out / "plan_cpu.json").write_text(json.dumps({"command": command, "date": stamp, "rows": rows}, indent=1) + "\n")
    lines = [f"# bench_plan (CPU, {os.cpu_count()} cores shared)", "", f"`{command}` — {stamp}", "",
             "| prompts | dataset MB | plan s (CLI) | prompts/s (CLI) | prompts/s (plan_dataset) | planner CPU s "
             "(all processes) | prompts per CPU-s | planner peak RSS MB (all processes) | units | "
             "worker start-up s (median) | worker peak RSS MB | HF tokenizer alone, prompts/s (1 process) | "
             "load avg before / after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['prompts']:,} | {r['dataset_mb']} | {r['plan_s']} | {r['prompts_per_s']:,} | "
                     f"{r['plan_dataset_prompts_per_s']:,} | {r['planner_cpu_s']} | {r['prompts_per_cpu_s']:,} | "
                     f"{r['planner_peak_rss_mb']} | {r['units']} | {r['worker_startup_s']} | "
                     f"{r['worker_peak_rss_mb']} | {r['hf_tokenizer_prompts_per_s_1_process']:,} | "
                     f"{r['load_avg_1m_before']} / {r['load_avg_1m_after']} |")
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        lines += ["", f"Worker at {b['prompts']:,} vs {a['prompts']:,} planned: start-up "
                      f"{100 * (b['worker_startup_s'] / a['worker_startup_s'] - 1):+.1f}%, peak RSS "
                      f"{100 * (b['worker_peak_rss_mb'] / a['worker_peak_rss_mb'] - 1):+.1f}% (target: within 10%)."]
    (out / "plan_cpu.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
