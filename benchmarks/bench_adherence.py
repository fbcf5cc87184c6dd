"""Prompt adherence of the embedded demo model: does the default job draw what it is asked?

Generates the bundled prompts (jobs/data/prompts.jsonl: demo scenes in phrasings the model was
not trained on), reads every image back with a fixed pixel rule (jobs/demo/classify.py) and
reports accuracy for object colour, background colour and shape, over the rows in held-out
phrasings (`heldout`) and over every row that states the attribute (`stated`):

- `eager`: SanaPipeline's own call on the held-out rows (no job, padder or graph runner);
- `job`: `python -m jobs.generate` with the default config (on a GPU: graphs where they pay);
- variants of the job, each compared image by image with `job` (decoded pixels equal):
  `job-graphs` (bcg.capture=always: every signature replayed), `job-eager` (bcg=off),
  `job-nopad` (bcg.text_buckets=[300]: every prompt at the pipeline's native 300, no re-cut),
  `job-b1` and `job-b8` (bcg.batch_sizes=[1] / [8]).

Job variants run as parallel processes (`--parallel`). Extra overrides go to every job, e.g. the
encoder folder on a machine without the MiniLM package.

    python benchmarks/bench_adherence.py --out benchmarks/results --tag h200 \
        --modes eager,job,job-graphs,job-eager,job-nopad,job-b1,job-b8 --parallel 6 \
        --extra device=cuda model.tiny.text_encoder=/tmp/minilm
    python benchmarks/bench_adherence.py --out benchmarks/results --tag cpu --limit 96 --modes eager,job,job-nopad,job-b1,job-b8
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.demo import prompt_set  # noqa: E402
from jobs.demo.adherence import ATTRIBUTES  # noqa: E402
from jobs.demo.classify import classify  # noqa: E402

VARIANTS = {
    "job": [],
    "job-graphs": ["bcg.capture=always"],
    "job-eager": ["bcg=off"],
    "job-nopad": ["bcg.text_buckets=[300]"],
    "job-b1": ["bcg.batch_sizes=[1]"],
    "job-b8": ["bcg.batch_sizes=[8]"],
}


def job_images(out_dir: Path) -> Dict[str, np.ndarray]:
    import webdataset as wds
    from PIL import Image

    got = {}
    urls = [str(p) for p in sorted(out_dir.glob("shard-*.tar"))]
    for s in wds.WebDataset(urls, shardshuffle=False):
        meta = json.loads(s["json"])
        ext = next(e for e in ("png", "jpg", "webp") if e in s)
        got[meta["key"]] = np.asarray(Image.open(io.BytesIO(s[ext])).convert("RGB"))
    return got


def run_job(name: str, overrides: List[str], dataset: str, out_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "jobs.generate", f"output_dir={out_dir}", "job.progress=false", *overrides]
    if dataset:
        cmd.append(f"dataset.path={dataset}")
    log = open(out_dir.parent / f"{name}.log", "w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def accuracy(readings: Dict[str, dict], rows: Dict[str, dict], heldout_only: bool) -> dict:
    acc = {}
    for a in ATTRIBUTES:
        pairs = [(getattr(rows[k]["labels"], a), r[a]) for k, r in readings.items()
                 if getattr(rows[k]["labels"], a) is not None and (rows[k]["heldout"] or not heldout_only)]
        acc[a] = round(sum(w == g for w, g in pairs) / len(pairs), 4) if pairs else None
        acc[f"{a}_n"] = len(pairs)
    return acc


def classify_all(images: Dict[str, np.ndarray], workers: int) -> Dict[str, dict]:
    keys = sorted(images)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        readings = list(pool.map(classify, [images[k] for k in keys], chunksize=16))
    return {k: r.as_dict() for k, r in zip(keys, readings)}


def eager_images(rows: Dict[str, dict], args) -> Dict[str, np.ndarray]:
    """SanaPipeline.__call__ on the held-out rows, configured as the default job (composed config)."""
    import torch

    from hydra import compose, initialize_config_dir

    from jobs.config import register_configs, to_typed
    from jobs.demo.adherence import generate_eager
    from jobs.models.registry import get_family

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        overrides = ["output_dir=/tmp/unused", *[o for o in args.extra if not o.startswith("device=")]]
        cfg = to_typed(compose("generate", overrides=overrides))
    device = "cuda" if torch.cuda.is_available() and "device=cpu" not in args.extra else "cpu"
    fam = get_family(cfg.model.family)
    pipe = fam.build_tiny(cfg.model, torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    from jobs.plan import derive_seed

    keys = [k for k, r in rows.items() if r["heldout"] and "negative_prompt" not in r]
    # the job's seeds (a row's own, else derived from the job seed and the key): same noise as `job`
    seeds = [rows[k].get("seed", derive_seed(cfg.sampling.seed, k)) for k in keys]
    s = cfg.sampling
    images = generate_eager(pipe, [rows[k]["prompt"] for k in keys], seeds, steps=s.steps,
                            guidance_scale=s.guidance_scale, height=s.height, width=s.width, batch=8,
                            max_sequence_length=cfg.model.max_sequence_length)
    return dict(zip(keys, images))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--modes", default="eager,job,job-nopad,job-b1,job-b8")
    ap.add_argument("--limit", type=int, default=0, help="first N bundled rows only (a JSONL subset)")
    ap.add_argument("--parallel", type=int, default=1, help="job variants run at once")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="classifier processes")
    ap.add_argument("--work", default="", help="folder for the job outputs (default: a temp folder)")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides for every job, e.g. device=cuda")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m != "eager" and m not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; known: eager, {', '.join(VARIANTS)}")

    rows = prompt_set.labels_by_key()
    work = Path(args.work or tempfile.mkdtemp(prefix="adherence-"))
    work.mkdir(parents=True, exist_ok=True)
    dataset = ""
    if args.limit:
        subset = work / "prompts.jsonl"
        lines = (ROOT / "jobs" / "data" / "prompts.jsonl").read_text(encoding="utf-8").splitlines(True)[:args.limit]
        subset.write_text("".join(lines), encoding="utf-8")
        dataset = str(subset)
        keep = {json.loads(line)["key"] for line in lines}
        rows = {k: r for k, r in rows.items() if k in keep}

    results, images, seconds = {}, {}, {}
    pending = [m for m in modes if m != "eager"]
    running = {}
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < args.parallel:
            m = pending.pop(0)
            (work / m).parent.mkdir(parents=True, exist_ok=True)
            running[m] = (run_job(m, args.extra + VARIANTS[m], dataset, work / m), time.perf_counter())
        for m, (proc, start) in list(running.items()):
            if proc.poll() is not None:
                del running[m]
                if proc.returncode:
                    tail = (work / f"{m}.log").read_text()[-3000:]
                    raise SystemExit(f"{m}: job failed (exit {proc.returncode}):\n{tail}")
                seconds[m] = round(time.perf_counter() - start, 1)
                images[m] = job_images(work / m)
        if "eager" in modes and "eager" not in images:
            start = time.perf_counter()
            images["eager"] = eager_images(rows, args)
            seconds["eager"] = round(time.perf_counter() - start, 1)
        time.sleep(0.5)

    base = images.get("job")
    for m in sorted(modes, key=lambda m: m != "job"):  # `job` first: the others are compared with it
        results[m] = classify_all(images[m], args.workers)
    out_rows = []
    for m in modes:
        readings = results[m]
        row = {"mode": m, "overrides": " ".join(VARIANTS.get(m, ["SanaPipeline.__call__"])) or "(default)",
               "images": len(readings), "seconds": seconds[m]}
        for a, v in accuracy(readings, rows, heldout_only=True).items():
            row[f"heldout_{a}"] = v
        for a, v in accuracy(readings, rows, heldout_only=False).items():
            row[f"stated_{a}"] = v
        if base is not None and m != "job":
            common = sorted(set(images[m]) & set(base))
            row["same_pixels_as_job"] = f"{sum(np.array_equal(images[m][k], base[k]) for k in common)}/{len(common)}"
            row["max_abs_diff_vs_job"] = int(max((np.abs(images[m][k].astype(int) - base[k]).max() for k in common),
                                                  default=0))
            row["mean_abs_diff_vs_job"] = round(float(np.mean([np.abs(images[m][k].astype(float) - base[k]).mean()
                                                               for k in common])), 4) if common else None
            named = ("background", "color", "shape")
            row["same_labels_as_job"] = f"{sum(all(readings[k][a] == results['job'][k][a] for a in named) for k in common)}/{len(common)}" if "job" in results else None
        out_rows.append(row)
        print(json.dumps(row), flush=True)

    import torch

    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and "device=cpu" not in args.extra
            else f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})",
            "torch": torch.__version__, "command": "python benchmarks/bench_adherence.py " + shlex.join(argv or sys.argv[1:]),
            "rows": len(rows), "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"adherence_{args.tag}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": out_rows, "readings": results}, indent=1))
    cols = ["mode", "overrides", "images", "heldout_color", "heldout_background", "heldout_shape", "stated_color",
            "stated_background", "stated_shape", "same_pixels_as_job", "mean_abs_diff_vs_job", "same_labels_as_job",
            "seconds"]
    lines = [f"# {stem}", "", f"- date: {meta['date']}", f"- device: {meta['device']}, torch {meta['torch']}",
             f"- command: `{meta['command']}`", f"- prompts: {meta['rows']} bundled rows; held-out rows counted in "
             f"`heldout_*` (n: {out_rows[0].get('heldout_color_n')})", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in out_rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
