"""One table from several bench_job_wall.py JSONs of one commit and setting: the runs of a session's
device calls (each call's $OUT starts empty, so `--resume` cannot carry them from one call to the next).

    python benchmarks/merge_job_wall.py --tag h200_1024_1000_s39 --out benchmarks/results A.json B.json C.json

Every input must hold runs of the same commit, family, steps, guidance and resolution
(bench_job_wall.Results.resume refuses others). The medians, minima and maxima are recomputed over
all the runs; FLOPs per image come from the inputs' rows (the model folder is not needed). The meta
keeps each input's date and command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_job_wall import Results  # noqa: E402


def merge(paths: list[Path], out: Path, tag: str) -> Path:
    """Write <out>/job_wall_<tag>.{json,md} with every run of `paths`; returns the JSON's path."""
    first = json.loads(paths[0].read_text())
    meta = dict(first["meta"])
    meta["command"] = "python benchmarks/merge_job_wall.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    meta["merged"] = [{"file": p.name, **{k: json.loads(p.read_text())["meta"].get(k) for k in ("date", "command")}}
                      for p in paths]
    modes: list[str] = []
    lanes: dict = {}
    for p in paths:
        earlier = json.loads(p.read_text())
        for row in earlier["rows"]:
            if row["mode"] not in modes:
                modes.append(row["mode"])
        for gpu, ran in (earlier["meta"].get("lanes") or {}).items():
            lanes.setdefault(gpu, []).extend(m for m in ran if m not in lanes[gpu])
    meta["lanes"] = lanes
    # Some runs went side by side where any input's did (bench_job_wall.py --lanes runs): its header says so.
    takes = {json.loads(p.read_text())["meta"].get("lanes_take", "modes") for p in paths}
    meta["lanes_take"] = "runs" if "runs" in takes else "modes"
    a = argparse.Namespace(family=meta.get("family", "sana"), steps=meta["steps"], guidance=meta["guidance"],
                           res=first["rows"][0]["resolution"], mode_order=modes, out=str(out), tag=tag, dir=None,
                           cache=meta.get("cache"))
    results = Results(a, meta)
    for p in paths:
        results.resume(p)
    results.write()
    return out / f"job_wall_{tag}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tag", required=True, help="the merged files' name: job_wall_<tag>.{json,md}")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("inputs", nargs="+", type=Path, help="bench_job_wall.py JSONs of one commit and setting")
    a = p.parse_args()
    print(merge(a.inputs, a.out, a.tag).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
