"""The planner's fixed cost: `python -m jobs.plan` from process start to exit on a few hundred to a
few thousand prompts, where imports and set-up are most of it (issue 28: <= 2 s for 1,000 prompts).

    python benchmarks/bench_plan_wall.py --out benchmarks/results                 # this tree
    git archive OLD | tar -x -C /tmp/old
    python benchmarks/bench_plan_wall.py --before /tmp/old --out benchmarks/results   # and an older checkout

Cases: the default preset (sana_tiny: MiniLM's tokenizer from its package) and `model=sana
model.path=DIR` (SANA's instruction prefix, the tokenizer of a diffusers folder: `--model-dir`, or a
tiny one made with bench_job_realsize.py's builder, same tokenizer as the real-size folder), at each
`--prompts` count (the bundled realistic prompts, cycled with new keys past 510). Each case runs
`--runs` times after one warm-up run (page cache warm), each into a fresh output_dir; with
`--before`, that tree's runs alternate with this one's (A B A B: drift in a shared machine's speed
hits both alike). A row holds min/median/max wall seconds, the median CPU seconds of the process
(user + system, from wait4: what a busy shared machine moves least) and plan_dataset's own
seconds from its log line. `--profile` adds `python -X importtime`'s heaviest top-level imports of
one run.
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "benchmarks" / "data" / "realistic_prompts.jsonl"


def write_prompts(path: Path, n: int) -> Path:
    """`n` rows of the realistic prompts (510 distinct texts), cycled with distinct keys."""
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({"key": f"p{i:06d}", "prompt": texts[i % len(texts)]}) + "\n" for i in range(n)))
    return path


def tiny_sana_folder(path: Path) -> Path:
    """A SANA diffusers folder of one-layer components with MiniLM's tokenizer (bench_job_realsize.py
    build --tiny): `.minilm` (a saved copy, what the GPU machine carries) or the package's."""
    if not (path / "model_index.json").exists():
        tokenizer = ROOT / ".minilm"
        if not tokenizer.is_dir():
            from jobs.models.text_encoders import minilm_path

            tokenizer = minilm_path()
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_job_realsize.py"), "build", "--dir", str(path),
                        "--tiny", "--tokenizer", str(tokenizer)], check=True, capture_output=True)
    return path


def run_once(root: Path, overrides: list, work: Path, importtime: bool = False) -> dict:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    # `root` first: its jobs/ shadows any other tree on the path (the wheels' folder stays after it)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               HYDRA_FULL_ERROR="1",
               BCGEN_ALLOW_HYDRA_PATHS="1")  # its hydra.run.dir keeps the logs out of the timed output_dir
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "jobs.plan", *overrides,
           f"output_dir={out}", f"hydra.run.dir={work / 'hydra'}"]
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        # wait4: this child's own CPU seconds, which another session's load on the cores barely moves
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{text[-4000:]}")
    inner = re.search(r"plan: \d+ rows -> .*?, ([\d.]+)s \(", text)
    row = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
           "plan_dataset_s": float(inner.group(1)) if inner else None}
    if importtime:
        row["top_imports"] = top_imports(text)
    return row


def top_imports(stderr: str, n: int = 8) -> list:
    """The heaviest imports made at top level (cumulative microseconds), from -X importtime."""
    rows = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m and not m.group(2).startswith(" "):
            rows.append((int(m.group(1)), m.group(2).strip()))
    return [{"module": name, "s": round(us / 1e6, 3)} for us, name in sorted(rows, reverse=True)[:n]]


def measure(trees: dict, case: str, overrides: list, prompts: int, runs: int, work: Path, profile: bool) -> list:
    """One row per tree ({"after": root, "before": root}), their runs interleaved."""
    for root in trees.values():
        run_once(root, overrides, work)  # warm-up: page cache, .pyc files
    done = {name: [] for name in trees}
    for _ in range(runs):
        for name, root in trees.items():
            done[name].append(run_once(root, overrides, work))
    rows = []
    for name, root in trees.items():
        walls = sorted(r["wall_s"] for r in done[name])
        inner = [r["plan_dataset_s"] for r in done[name] if r["plan_dataset_s"] is not None]
        row = {"tree": name, "commit": commit_of(root), "case": case, "prompts": prompts, "runs": runs,
               "wall_s": round(statistics.median(walls), 3), "wall_min_s": round(walls[0], 3),
               "wall_max_s": round(walls[-1], 3),
               "cpu_s": round(statistics.median(r["cpu_s"] for r in done[name]), 3),
               "plan_dataset_s": round(statistics.median(inner), 3) if inner else None,
               "wall_all_s": [round(w, 3) for w in walls]}
        if profile:
            row["top_imports"] = run_once(root, overrides, work, importtime=True)["top_imports"]
        rows.append(row)
    return rows


def commit_of(root: Path) -> str:
    stamp = root / "COMMIT"  # a `git archive` export has no .git: write its commit here
    if stamp.exists():
        return stamp.read_text().strip()
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(out: Path, stem: str, meta: dict, rows: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# {stem}: `python -m jobs.plan`, process start to exit", "",
             f"- {meta['date']}, {meta['cpus']} CPUs, load average {meta['load_before']} before / {meta['load_after']} after",
             f"- command: `{meta['command']}`", "",
             "| tree | commit | case | prompts | runs | wall s (median) | min | max | CPU s (median) | plan_dataset s | heaviest imports (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        imports = ", ".join(f"{i['module']} {i['s']}" for i in r.get("top_imports", [])[:5]) or "—"
        lines.append(f"| {r['tree']} | `{r['commit']}` | {r['case']} | {r['prompts']} | {r['runs']} | {r['wall_s']} | "
                     f"{r['wall_min_s']} | {r['wall_max_s']} | {r['cpu_s']} | {r['plan_dataset_s']} | {imports} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=ROOT, help="the source tree whose jobs.plan runs (a checkout)")
    p.add_argument("--before", type=Path, default=None, help="an older checkout to run beside it")
    p.add_argument("--prompts", default="510,1000", help="comma list of prompt counts")
    p.add_argument("--cases", default="sana_tiny,sana", help="sana_tiny (the default preset), sana (model.path)")
    p.add_argument("--model-dir", type=Path, default=None, help="a SANA diffusers folder (default: a tiny one)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="one more run under -X importtime per case")
    p.add_argument("--tag", default="cpu", help="the result file is plan_wall_<tag>")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_plan_wall-"))
    try:
        model_dir = a.model_dir or tiny_sana_folder(work / "sana")
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
                "command": "python " + " ".join(sys.argv),
                "python": sys.version.split()[0], "load_before": round(os.getloadavg()[0], 2)}
        rows = []
        for n in (int(v) for v in a.prompts.split(",")):
            data = write_prompts(work / f"prompts_{n}.jsonl", n)
            for case in a.cases.split(","):
                overrides = [f"dataset.path={data}"]
                if case == "sana":
                    overrides += ["model=sana", f"model.path={model_dir}"]
                trees = {"after": a.root, **({"before": a.before} if a.before else {})}
                rows += measure(trees, case, overrides, n, a.runs, work, a.profile)
        meta["load_after"] = round(os.getloadavg()[0], 2)
        write(a.out, f"plan_wall_{a.tag}", meta, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
