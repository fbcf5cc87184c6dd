"""What a plain rerun's check of done units costs at scale (jobs/worker/recheck.py).

    python benchmarks/bench_resume_check.py --shards 200000 --per-unit 5 --dir /tmp/bench_recheck

Builds an output_dir with N committed shards (tiny tar, parquet and stats files, their manifests, a
done marker per unit of `--per-unit` shards, as a job writes them), then times the check a rerun
makes before leasing anything: one listing of output_dir and of _manifest/, one stat a file, every
marker read and compared. Run twice (cold and warm page cache: the second is what a rerun right
after a job sees). Prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def build(root: Path, shards: int, per_unit: int) -> None:
    """The files a job leaves, written plainly (no fsync: building 800k files is not what is measured)."""
    from dataclasses import asdict

    from sinks.manifest import MANIFEST_VERSION, ShardRecord
    from sinks.tar_check import file_stamp

    (root / "_plan" / "done").mkdir(parents=True, exist_ok=True)
    (root / "_manifest").mkdir(exist_ok=True)
    for unit in range(-(-shards // per_unit)):
        records = []
        for i in range(per_unit):
            url = f"shard-u{unit:07d}-{i:04d}.tar"
            names = [url, url[:-4] + ".parquet", url[:-4] + "_stats.json"]
            for n in names:
                (root / n).write_bytes(b"x" * 512)
            stamps = {n: file_stamp(os.stat(root / n)) for n in names}
            record = ShardRecord(url, 1, 512, "0" * 64, ["k"], [["k.json", 1]],
                                 [[names[1], 512, "0" * 64], [names[2], 512, "0" * 64]], "run", stamps)
            m = f"_manifest/{url}.json"
            (root / m).write_text(json.dumps({"manifest_version": MANIFEST_VERSION, **asdict(record)}))
            record.stamps[m] = file_stamp(os.stat(root / m))
            records.append(record)
        body = {"unit": unit, "owner": "bench", "items": per_unit,
                "shards": [{k: v for k, v in asdict(r).items() if k != "keys"} for r in records]}
        (root / "_plan" / "done" / f"unit-{unit:07d}.json").write_text(json.dumps(body))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=200_000)
    ap.add_argument("--per-unit", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_recheck"))
    args = ap.parse_args()
    from jobs.output.done import done_units
    from jobs.output.mirror import LocalShards
    from jobs.worker.recheck import FactDict, marker_records, stat_problems

    root = args.dir
    if not (root / "_plan" / "done").is_dir():
        t0 = time.perf_counter()
        build(root, args.shards, args.per_unit)
        print(f"built {args.shards} shards in {time.perf_counter() - t0:.1f}s")
    shards = LocalShards(root, None)
    for attempt in ("first", "second"):
        t0 = time.perf_counter()
        facts = FactDict(shards.facts())
        t1 = time.perf_counter()
        bad = 0
        units = sorted(done_units(root / "_plan"))
        for unit in units:
            problems, moved = stat_problems(marker_records(root / "_plan", unit), facts, unit)
            bad += bool(problems or moved)
        t2 = time.perf_counter()
        print(json.dumps({"run": attempt, "shards": args.shards, "units": len(units), "files_stat": len(facts),
                          "listing_and_stat_s": round(t1 - t0, 2), "markers_and_compare_s": round(t2 - t1, 2),
                          "total_s": round(t2 - t0, 2), "units_flagged": bad}))


if __name__ == "__main__":
    main()
