"""What one batch shape pads, per family, on realistic prompts (issue 30's cost of the contract).

At one batch size (`bcg.batch_sizes=[8]`, `bcg.pad_short_batches`) every unit's short tail is padded
with dummy rows that every stage runs. How many depends on how many signatures the plan makes: a
family with text buckets (SANA, Qwen-Image) makes a few, a fixed-length one (Flux, LongCat-Image)
one, and one whose signature is the exact caption length (Z-Image; GLM-Image's glyph length) as
many as there are lengths. This runs the real planner (`python -m jobs.plan`) on the first N of
`benchmarks/data/realistic_prompts.jsonl` for each tiny preset and counts, from the plan's units,
the rows each pool runs:

    pool [8]         full batches plus each unit's tail padded to 8
    pool [1]         one row a batch: no padding
    pool [1,2,4,8]   the tail cut into powers of two: no padding, other shapes

The tiny presets count tokens with the offline MiniLM WordPiece tokenizer (Z-Image's with a
Qwen3-style chat template), not the released models' tokenizers, so the number of distinct lengths
is a proxy of the real one; the buckets and the rules are the presets' own.

    python benchmarks/bench_pool_padding.py --prompts 200,510 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

PRESETS = ["sana_tiny", "flux_tiny", "qwen_image_tiny", "longcat_image_tiny", "z_image_tiny", "glm_image_tiny"]
DATA = ROOT / "benchmarks" / "data" / "realistic_prompts.jsonl"
COLUMNS = ["preset", "prompts", "signatures", "units", "rows_at_8", "padding_rows_at_8", "padding_share_at_8",
           "batches_at_8", "batches_at_1", "batches_at_1248"]


def plan(preset: str, data: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "jobs.plan", f"model={preset}", f"dataset.path={data}", f"output_dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads((out / "_plan" / "plan.json").read_text())


def pool_cost(units: list, pool: list) -> tuple:
    """(rows, batches) the stages run for units of these item counts at `pool`, cut as the job cuts
    them (jobs.plan.cut_batches, short tails padded)."""
    from jobs.plan import cut_batches

    batches = [b for n in units for b in cut_batches(range(n), pool, pad_short=True)]
    return sum(size for _, size in batches), len(batches)


def row(preset: str, prompts: int, manifest: dict) -> dict:
    units = [int(u["count"]) for u in manifest["units"]]
    (rows8, batches8), (_, batches1), (_, batches1248) = (pool_cost(units, p) for p in ([8], [1], [1, 2, 4, 8]))
    return {"preset": preset, "prompts": prompts, "signatures": len(manifest["signatures"]), "units": len(units),
            "rows_at_8": rows8, "padding_rows_at_8": rows8 - sum(units),
            "padding_share_at_8": round((rows8 - sum(units)) / rows8, 3), "batches_at_8": batches8,
            "batches_at_1": batches1, "batches_at_1248": batches1248}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="200,510")
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from common import commit, environment, write_results

    lines = DATA.read_text().splitlines()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(v) for v in a.prompts.split(",")):
            data = Path(tmp) / f"prompts{n}.jsonl"
            data.write_text("\n".join(lines[:n]) + "\n")
            for preset in a.presets.split(","):
                rows.append(row(preset, n, plan(preset, data, Path(tmp) / f"{preset}-{n}")))
                print(json.dumps(rows[-1]), flush=True)
    meta = environment() | {"commit": commit()}
    notes = [f"commit `{meta['commit']}`; the real planner on the first N rows of {DATA.relative_to(ROOT)}; "
             "rows_at_8: the rows every stage runs at the pool [8] (padding included); batches_at_1248: the pool "
             "[1, 2, 4, 8]'s batches (a tail cut into powers of two)"]
    write_results(a.out, "pool_padding_cpu", rows, COLUMNS, notes=notes, meta=meta)


if __name__ == "__main__":
    main()
