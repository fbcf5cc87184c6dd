"""The Ray driver at scale on the CPU: what it costs per work unit, and its memory, with many actors.

    python benchmarks/bench_ray_driver.py --prompts 1000000 --unit-items 500 --actors 16,64 \
        --out benchmarks/results

The driver is the real one (jobs/cluster/pool.py: Pool over the real UnitQueue, the real lease per
unit (Grants), the real progress), on a real local Ray cluster (loopback). The actors are stand-ins
with the real actor's call surface and the real UnitFeed: instead of a model they sleep `--batch-s`
per batch of `--batch` items, so a unit of 500 items takes 63 sleeps. The plan is synthetic (a
plan.json of `--prompts` items in units of `--unit-items`, 8 signatures): the driver never reads a
unit's rows, only plan.json.

Measured per actor count, once all actors are up (their start-up is Ray's, and not the driver's):
- driver CPU per unit: the driver process's CPU seconds (every thread: Ray's core worker and
  gRPC included) over the run, divided by the units handed out;
- actor idle between units: from a unit's release to the start of the next, in the actor (with one
  unit queued ahead it is the feed's hand-off, unless the driver falls behind);
- wall against the ideal (units x unit time / actors) and units/s;
- the driver's RSS.
Then, in a fresh interpreter, the driver's memory for the plan of 1B prompts at 5,000 items a unit
(200k units: read plan.json, build the queue), and the estimate for 1,000 GPUs: written with the
measured numbers into the result's notes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, write_results  # noqa: E402
from jobs.plan import Signature  # noqa: E402
from jobs.plan.units import PlanManifest, UnitInfo, write_manifest  # noqa: E402
from tests import ray_standin  # noqa: E402

log = logging.getLogger("bench_ray_driver")

# SANA-1.6B at 1024², 20 steps, CFG, on one H200: the default job's 3.06 images/s (ANCHORS.md, 2026-12-01).
H200_IMAGES_PER_S = 3.06


def signatures(n: int = 8):
    sides = [(512, 512), (768, 768), (1024, 1024), (1024, 768)]
    return [Signature(height=h, width=w, text_bucket=b, steps=20, guidance_scale=4.5, cfg=True, dtype="bfloat16")
            for (h, w) in sides for b in (128, 256)][:n]


def synthetic_plan(prompts: int, unit_items: int) -> PlanManifest:
    sigs = signatures()
    per_sig = prompts // len(sigs)
    units, uid = [], 0
    for i, sig in enumerate(sigs):
        left = per_sig + (prompts - per_sig * len(sigs) if i == len(sigs) - 1 else 0)
        while left > 0:
            count = min(unit_items, left)
            units.append(UnitInfo(id=uid, signature=sig, count=count, cost=count * sig.height * sig.width / 1e6))
            uid += 1
            left -= count
    return PlanManifest(identity={"bench": True}, dataset={"path": "synthetic", "bad_rows": 0, "records": prompts},
                        unit_items=unit_items, units=units)


class StandIn(ray_standin.StandIn):
    """The tests' stand-in actor (the real actor's call surface over the real UnitFeed), whose unit
    sleeps `batch_s` a batch of `batch` and records the gap between units."""

    def __init__(self, batch: int, batch_s: float):
        super().__init__()
        self.batch, self.batch_s = batch, batch_s
        self.done = set()  # type: ignore[assignment]  # thousands of units an actor: a set to look up
        self.gaps: list = []
        self.units = 0

    def run(self) -> dict:
        ended = None
        while True:
            info = self.feed.next_unit(None)
            if info is None:
                break
            if ended is not None:
                self.gaps.append(time.perf_counter() - ended)
            for _ in range(math.ceil(info.count / self.batch)):
                time.sleep(self.batch_s)
            self.done.add(info.id)
            self.units += 1
            ended = time.perf_counter()
            self.feed.release(info.id)
        self.feed.release_all()
        return {"units": self.units, "gaps": self.gaps, "status": "complete"}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_pool(manifest: PlanManifest, actors: int, cpus: float, args, work: Path) -> dict:
    import ray

    from jobs.cluster.grants import Grants
    from jobs.cluster.pool import Pool
    from jobs.cluster.progress import DriverProgress
    from jobs.cluster.queue import UnitQueue
    from jobs.worker.stop import StopFlag

    plan_dir = work / f"plan-{actors}"
    plan_dir.mkdir(parents=True)
    write_manifest(plan_dir, manifest)
    cls = ray.remote(StandIn).options(num_cpus=cpus / actors, max_concurrency=8)
    t0 = time.perf_counter()
    handles = [cls.remote(args.batch, args.batch_s) for _ in range(actors)]
    ray.get([h.where.remote() for h in handles])
    startup = time.perf_counter() - t0
    rss0 = rss_mb()
    grants = Grants(plan_dir, "bench-driver", 600.0)
    progress = DriverProgress(manifest.n_items, 0, bar=False, log_every_s=1e9)
    pool = Pool(lambda part: handles[part], actors, UnitQueue(manifest.units), grants, progress, 0, True, True)
    cpu0, t1 = time.process_time(), time.perf_counter()
    result = pool.run(StopFlag())
    wall, cpu = time.perf_counter() - t1, time.process_time() - cpu0
    grants.release_all()
    records = result.records
    gaps = sorted(g for r in records for g in r["gaps"])
    units = sum(r["units"] for r in records)
    assert units == len(manifest.units), (units, len(manifest.units))
    for h in handles:
        ray.kill(h)
    unit_s = math.ceil(args.unit_items / args.batch) * args.batch_s
    ideal = len(manifest.units) * unit_s / actors
    return {"actors": actors, "units": units, "unit_s": round(unit_s, 4), "actor_startup_s": round(startup, 1),
            "wall_s": round(wall, 2), "ideal_s": round(ideal, 2), "overhead_pct": round(100 * (wall / ideal - 1), 1),
            "units_per_s": round(units / wall, 1), "driver_cpu_s": round(cpu, 2),
            "driver_cpu_ms_per_unit": round(1e3 * cpu / units, 3),
            "gap_ms_mean": round(1e3 * sum(gaps) / max(len(gaps), 1), 3),
            "gap_ms_p99": round(1e3 * gaps[int(0.99 * (len(gaps) - 1))], 3) if gaps else None,
            "driver_rss_mb_before": round(rss0, 1), "driver_rss_mb_after": round(rss_mb(), 1)}


class Pending:
    """Calls that stay in flight (an async actor holds thousands cheaply): what ray.wait scans."""

    async def hold(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)


def wait_cost(counts, repeats: int = 101) -> list:
    """ms of one ray.wait(refs, num_returns=1, timeout=0) with `count` calls in flight (median): the loop's
    O(calls) term (3 calls an actor: its unit, the one queued, its run())."""
    import ray

    rows = []
    for count in counts:
        holder = ray.remote(Pending).options(num_cpus=0, max_concurrency=count + 10).remote()
        refs = [holder.hold.remote(600) for _ in range(count)]
        ray.wait(refs, num_returns=1, timeout=2.0)  # every call submitted and pending
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            ray.wait(refs, num_returns=1, timeout=0)
            times.append(time.perf_counter() - t)
        times.sort()  # the median: other sessions' load on the shared cores makes the mean a lottery
        rows.append({"calls_in_flight": count, "wait_ms": round(times[len(times) // 2] * 1e3, 3),
                     "wait_ms_min": round(times[0] * 1e3, 3)})
        ray.kill(holder)
    return rows


MEMORY_PROBE = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
import ray
from jobs.cluster.queue import UnitQueue
from jobs.plan.units import read_manifest
from pathlib import Path
base = rss()
t = time.perf_counter()
manifest = read_manifest(Path(sys.argv[2]))
read_s = time.perf_counter() - t
after_read = rss()
queue = UnitQueue(u for u in manifest.units)
after_queue = rss()
t = time.perf_counter()
n = 0
while queue.take(None) is not None:
    n += 1
take_us = (time.perf_counter() - t) / n * 1e6
# RSS now, not ru_maxrss: that one survives fork + exec, so it would report the parent's peak.
print(json.dumps({"units": len(manifest.units), "rss_imports_mb": round(base, 1), "read_s": round(read_s, 2),
                  "plan_mb": round(after_read - base, 1), "queue_mb": round(after_queue - after_read, 1),
                  "take_us": round(take_us, 2), "rss_mb": round(max(after_queue, rss()), 1)}))
"""


def memory_probe(prompts: int, unit_items: int, work: Path) -> dict:
    plan_dir = work / f"mem-{prompts}"
    plan_dir.mkdir(parents=True)
    write_manifest(plan_dir, synthetic_plan(prompts, unit_items))
    size = (plan_dir / "plan.json").stat().st_size
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(ROOT), str(plan_dir)], capture_output=True,
                         text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(prompts=prompts, unit_items=unit_items, plan_json_mb=round(size / 2**20, 1))
    return row


def estimate(rows: list, waits: list, mem: dict, gpus: int = 1000, prompts: float = 1e9,
             unit_items: int = 5000) -> list:
    """The 1,000-GPU, 1B-prompt estimate from what was measured (lines for the notes)."""
    by = sorted(rows, key=lambda r: r["actors"])
    lo, hi = by[0], by[-1]
    slope = (hi["driver_cpu_ms_per_unit"] - lo["driver_cpu_ms_per_unit"]) / max(hi["actors"] - lo["actors"], 1)

    def wait_ms(calls: float) -> float:  # piecewise linear through the measured points
        pts = sorted((w["calls_in_flight"], w["wait_ms"]) for w in waits)
        for (c0, m0), (c1, m1) in zip(pts, pts[1:]):
            if calls <= c1:
                return m0 + (m1 - m0) * (calls - c0) / (c1 - c0)
        (c0, m0), (c1, m1) = pts[-2], pts[-1]
        return m1 + (m1 - m0) * (calls - c1) / (c1 - c0)

    # Two ray.wait calls a loop turn, each over ~3 calls an actor; the rest of a unit's cost is O(1).
    extra = 2 * (wait_ms(3 * gpus) - wait_ms(3 * hi["actors"]))
    per_unit_ms = hi["driver_cpu_ms_per_unit"] + max(extra, 0.0)
    units = prompts / unit_items
    unit_s = unit_items / H200_IMAGES_PER_S
    rate = gpus / unit_s
    return [
        f"1B prompts at {unit_items} items a unit = {units:,.0f} units; one unit on one H200 (SANA-1.6B 1024², "
        f"{H200_IMAGES_PER_S} images/s) takes {unit_s:,.0f} s, so {gpus} GPUs complete {rate:.2f} units/s.",
        f"driver CPU per unit: {lo['driver_cpu_ms_per_unit']} ms at {lo['actors']} actors, "
        f"{hi['driver_cpu_ms_per_unit']} ms at {hi['actors']} ({slope * 1e3:+.1f} µs per extra actor, within "
        f"noise); the part that grows with actors is ray.wait over every call in flight: "
        + ", ".join(f"{w['wait_ms']} ms at {w['calls_in_flight']}" for w in waits)
        + f". At {gpus} actors (~{3 * gpus} calls, two waits a turn): {per_unit_ms:.1f} ms a unit.",
        f"at {rate:.2f} units/s that is {rate * per_unit_ms / 10:.2f}% of one driver core; the whole job's "
        f"scheduling: {units * per_unit_ms / 1e3 / 60:,.0f} CPU-minutes against ~{units * unit_s / gpus / 3600:,.0f} "
        f"hours of wall clock. The measured ceiling here, {hi['units_per_s']} units/s at {hi['actors']} actors on 2 "
        f"shared cores, is {hi['units_per_s'] / rate:,.0f}x the rate 1,000 GPUs need.",
        f"driver memory for {mem['units']:,} units ({mem['prompts']:,} prompts at {mem['unit_items']} a unit): "
        f"plan.json {mem['plan_json_mb']} MB on disk, +{mem['plan_mb']} MB read ({mem['read_s']} s), queue "
        f"+{mem['queue_mb']} MB, RSS {mem['rss_mb']} MB with Ray imported ({mem['rss_imports_mb']} MB before the plan); "
        f"{mem['take_us']} µs a take. Per actor the driver holds a handle, a slot and up to 2 leases "
        f"(an open descriptor each: 2,000 at 1,000 actors, so the driver raises its soft limit).",
    ]


def main() -> None:
    import ray

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=1_000_000)
    p.add_argument("--unit-items", type=int, default=500)
    p.add_argument("--actors", default="16,64")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batch-s", type=float, default=0.002)
    p.add_argument("--cpus", type=float, default=2.0, help="logical CPUs of the local cluster, shared by the actors")
    p.add_argument("--memory-prompts", type=int, default=1_000_000_000)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # one machine: Ray on the loopback
    manifest = synthetic_plan(args.prompts, args.unit_items)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        try:
            for actors in [int(a) for a in args.actors.split(",")]:
                row = run_pool(manifest, actors, args.cpus, args, work)
                log.info("%s", row)
                rows.append(row)
            waits = wait_cost([3 * max(r["actors"] for r in rows), 1000, 3000, 6000])
            log.info("ray.wait: %s", waits)
        finally:
            ray.shutdown()
        mem = memory_probe(args.memory_prompts, 5000, work)
        log.info("memory: %s", mem)
    meta = dict(environment(), ray=ray.__version__, prompts=args.prompts, unit_items=args.unit_items,
                batch=args.batch, batch_s=args.batch_s, cpus=args.cpus, cores=os.cpu_count(), memory=mem, waits=waits,
                driver_peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    columns = ["actors", "units", "unit_s", "actor_startup_s", "wall_s", "ideal_s", "overhead_pct", "units_per_s",
               "driver_cpu_s", "driver_cpu_ms_per_unit", "gap_ms_mean", "gap_ms_p99", "driver_rss_mb_after"]
    notes = [f"plan: {args.prompts:,} prompts in {len(manifest.units):,} units of {args.unit_items}; stand-in actors "
             f"sleep {args.batch_s * 1e3:g} ms a batch of {args.batch}; {args.cpus:g} logical CPUs shared by the "
             f"actors (fractional num_cpus) on a {os.cpu_count()}-core machine shared with other sessions."]
    notes += estimate(rows, waits, mem)
    jpath, mpath = write_results(args.out, "ray_driver_cpu", rows, columns, notes, meta)
    print(mpath.read_text())


if __name__ == "__main__":
    main()
