"""The whole job on one GPU, graph replay vs eager: the embedded tiny SANA over the bundled prompts.

The tiny model is launch-bound, the regime where graphs matter most; the job also times text
encoding, VAE decode and the sink, so this shows what replay buys end to end, not the DiT alone.

    python benchmarks/bench_job.py --out benchmarks/results   # writes job_tiny_<gpu>.json / .md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(overrides, out_dir) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "jobs.generate", f"output_dir={out_dir}", "job.progress=false", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((Path(out_dir) / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--extra", nargs="*", default=[], help="extra overrides, e.g. model.tiny.text_encoder=.minilm")
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    rows = []
    for label, extra in (("eager", ["bcg=off"]), ("bcg", [])):
        with tempfile.TemporaryDirectory() as tmp:
            s = run([*extra, *args.extra], tmp)
        st = s["stage_seconds"]
        rows.append({"mode": label, "items": s["items_written"], "images_per_s": s["images_per_s"],
                     "generate_s": st.get("generate"), "load_s": st.get("load"), "plan_s": st.get("plan"),
                     "hits": s["graph"].get("hits", 0), "misses": s["graph"].get("misses", 0),
                     "captures": s["graph"].get("captures", 0),
                     "capture_s": round(s["graph"].get("capture_seconds", 0.0), 3),
                     "signatures": len(s["signatures"]), "modes": s["modes"]})
    speedup = rows[1]["images_per_s"] / rows[0]["images_per_s"] if rows[0]["images_per_s"] else None
    result = {"benchmark": "job_tiny", "gpu": gpu, "date": datetime.date.today().isoformat(),
              "command": "python benchmarks/bench_job.py " + " ".join(sys.argv[1:]), "rows": rows,
              "speedup_images_per_s": round(speedup, 3) if speedup else None}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "h200" if "H200" in gpu else gpu.replace(" ", "_").lower()
    (out / f"job_tiny_{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Whole job, tiny SANA, bundled prompts ({gpu}, {result['date']})", "",
             f"Command: `{result['command']}`", "",
             "| mode | items | images/s | generate s | hits | misses | captures | capture s | signatures |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['items']} | {r['images_per_s']:.1f} | {r['generate_s']:.2f} | {r['hits']} | "
                     f"{r['misses']} | {r['captures']} | {r['capture_s']} | {r['signatures']} |")
    lines += ["", f"bcg / eager images/s: {result['speedup_images_per_s']}x"]
    (out / f"job_tiny_{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
