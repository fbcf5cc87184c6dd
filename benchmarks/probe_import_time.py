"""What the job's load stage imports costs, by environment (issue 28's first batch).

The load's imports were 8.2-8.7 s of the SANA-1.6B job's 19.3 s to its first batch on the H200 in
session 48, and `python -X importtime` put 2.15 s of them in scikit-learn: transformers 5.17 to 5.20
import `sklearn.metrics` at the top of their assisted-generation module wherever scikit-learn is
installed, 5.21 and later only when that code runs (`import_time_h200_s48.md`). This probe times what
the job's `imports` part does, `import diffusers` and its lazy `SanaPipeline` (transformers and the
text encoder's modelling code with it) after torch, each in a fresh process, `--runs` times, the
environments alternated run by run so drift reaches them alike:

    base               the interpreter's own site-packages
    NAME=DIR[:DIR...]  the same with DIR first on PYTHONPATH (an overlay: another transformers, say)

Each run also says which transformers it imported, and whether scikit-learn and torch._dynamo were
imported by the end, so a row names what its time paid for.

    python benchmarks/probe_import_time.py --runs 5 --out benchmarks/results --tag cpu_s49 \
        --overlay transformers_5.17=/tmp/t517:/tmp/t517dep
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

CHILD = r'''
import json, sys, time
import torch
t0 = time.perf_counter()
import diffusers
diffusers.SanaPipeline
seconds = time.perf_counter() - t0
import transformers
print(json.dumps({"seconds": seconds, "transformers": transformers.__version__,
                  "sklearn": "sklearn" in sys.modules, "torch_dynamo": "torch._dynamo" in sys.modules}))
'''


def one(overlay: str) -> dict:
    """One fresh interpreter's import time with `overlay` (os.pathsep-joined folders, or "") first on its path."""
    path = os.pathsep.join(filter(None, [overlay, os.environ.get("PYTHONPATH", "")]))
    env = dict(os.environ, PYTHONPATH=path) if path else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"overlay {overlay or '(none)'}: the import failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(name: str, runs: list) -> dict:
    secs = [r["seconds"] for r in runs]
    last = runs[-1]
    return {"environment": name, "transformers": last["transformers"], "runs": len(runs),
            "import_s": round(statistics.median(secs), 3), "import_s_min": round(min(secs), 3),
            "import_s_max": round(max(secs), 3), "sklearn_imported": all(r["sklearn"] for r in runs),
            "torch_dynamo_imported": all(r["torch_dynamo"] for r in runs)}


def parse_overlay(text: str) -> tuple:
    name, eq, dirs = text.partition("=")
    if not eq or not name or not dirs:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR[:DIR...] (folders put first on PYTHONPATH)")
    missing = [d for d in dirs.split(os.pathsep) if not Path(d).is_dir()]
    if missing:
        raise argparse.ArgumentTypeError(f"{text!r}: no folder {missing[0]!r}")
    return name, dirs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--overlay", action="append", default=[], type=parse_overlay, metavar="NAME=DIR[:DIR...]")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--tag", default=None, help="the result files' suffix (default: the device's tag)")
    a = p.parse_args()
    from common import commit, device_tag, environment, write_results

    envs = [("base", ""), *a.overlay]
    runs: dict = {name: [] for name, _ in envs}
    for i in range(a.runs):
        for name, dirs in envs:  # alternated: a drifting machine reaches every environment alike
            runs[name].append(one(dirs))
            print(f"run {i + 1}/{a.runs} {name}: {runs[name][-1]}", flush=True)
    rows = [summarize(name, runs[name]) for name, _ in envs]
    meta = environment() | {"commit": commit(), "overlays": dict(a.overlay), "cpus": os.cpu_count()}
    columns = ["environment", "transformers", "runs", "import_s", "import_s_min", "import_s_max", "sklearn_imported",
               "torch_dynamo_imported"]
    notes = [f"commit `{meta['commit']}`; {meta['cpus']} CPUs",
             "import_s: `import diffusers; diffusers.SanaPipeline` after `import torch`, a fresh process a run, "
             "median [min, max]; environments alternated run by run",
             *[f"overlay {name}: {dirs} first on PYTHONPATH" for name, dirs in a.overlay]]
    tag = a.tag or device_tag()
    for path in write_results(a.out, f"import_time_{tag}", rows, columns, notes, meta):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
