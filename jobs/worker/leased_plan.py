"""The worker's plan: batches of the units it leases, one unit at a time, for as long as any is left.

`units()` is what the generation loop iterates: lease a unit, read its items (one unit in memory),
drop the keys its earlier holders already committed (one glob of the unit's own shards), cut them
into pool-sized batches, register the unit with the sink, yield the unit's batches (a run of one
signature, which the stage pipeline and its capture policy take as a whole). Order of units: the signature
this worker has warm first (its graphs stay captured), then the costliest (longest-processing-
time-first balances the tail), rotated by the worker's part so workers started together try
different units first.

When no unit is free but others hold some, the worker waits (job.wait_for_leases) and takes over
any whose lease expires: a dead worker's unit is finished by a live one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

from jobs.output.done import done_units
from jobs.output.layout import PLAN_FILE, unit_name, unit_shard_glob
from jobs.output.leases import live_leases
from jobs.plan import Batch, Signature, cut_batches
from jobs.plan.units import PlanManifest, UnitInfo, check_unit_file, read_unit
from jobs.worker.lease import Leaser
from jobs.worker.stop import StopFlag
from jobs.worker.unit_sink import UnitSink
from sinks.owned_scan import Ownership

log = logging.getLogger("jobs.run")


@dataclass
class PlanSettings:
    """How this worker reads, cuts and orders the units it leases (from the config)."""

    batch_sizes: List[int]  # the pool: each unit's items are cut into batches of these sizes
    pad_short: bool  # a tail smaller than every size is padded up (bcg.pad_short_batches)
    dtype: str  # the dtype the units were planned for
    part: int  # this worker's part: rotates where it starts leasing
    wait: bool  # with nothing free, wait for others' leases (job.wait_for_leases)
    verify: str = "members"  # how a leased unit's committed shards are checked (job.verify)


class LeasedPlan:
    def __init__(self, manifest: PlanManifest, plan_dir: Path, leaser: Leaser, sink: UnitSink,
                 settings: PlanSettings, stop: Optional[StopFlag] = None):
        self.manifest, self.plan_dir, self.leaser, self.sink = manifest, plan_dir, leaser, sink
        self.settings, self.stop = settings, stop
        done = done_units(plan_dir)
        self.n_items = sum(u.count for u in manifest.units if u.id not in done)  # left at start (progress)
        self.done_at_start = manifest.n_items - self.n_items
        order = sorted((u for u in manifest.units if u.id not in done), key=lambda u: (-u.cost, u.id))
        k = settings.part % len(order) if order else 0
        self._order: List[UnitInfo] = order[k:] + order[:k]
        # Filled as units are leased, for the summary.
        self.planned = 0
        self.skipped_done = 0
        self.truncated = 0
        self.leased: List[int] = []
        self.signature_counts: Dict[Signature, int] = {}
        self._last: Optional[Signature] = None
        self._plan_stat = self._stat()

    @property
    def units_left(self) -> int:
        return len(self._order)

    def _stat(self) -> tuple:
        st = (self.plan_dir / PLAN_FILE).stat()
        return st.st_ino, st.st_mtime_ns

    def _check_plan_unchanged(self) -> None:
        """A job.overwrite by another job replaces the plan while this worker waits between units
        (it holds no lease then, so the overwrite is allowed): stop rather than generate the new
        plan's units with this worker's old config."""
        try:
            same = self._stat() == self._plan_stat
        except FileNotFoundError:
            same = False
        if not same:
            raise RuntimeError(f"the plan in {self.plan_dir} was replaced or removed while this worker ran "
                               f"(job.overwrite=true by another job?); this worker stops. Rerun it to join the new run.")

    def units(self) -> Iterator[List[Batch]]:
        """The batches of each unit this worker leases, a unit at a time (leased when asked for)."""
        while True:
            info = self._next_unit()
            if info is None:
                return
            batches = self._unit_batches(info)
            if batches:  # a unit whose items were all committed is marked done, not generated
                yield batches

    def _unit_batches(self, info: UnitInfo) -> List[Batch]:
        self.sink.shards.fetch_unit(self.plan_dir / f"{unit_name(info.id)}.parquet")  # an object store: on lease
        check_unit_file(self.plan_dir, self.manifest, info.id)  # a damaged unit would give other seeds
        items = read_unit(self.plan_dir, info, self.manifest.source_files, self.settings.dtype)
        # Ours to check and clean: we hold its lease. A shard that no longer matches its manifest is
        # quarantined by the scan, and its samples are generated again.
        owner = Ownership(self.sink.run, frozenset(it.key for it in items))  # adopt only this run's, of these keys
        prior, _ = self.sink.shards.scan(unit_shard_glob(info.id), self.settings.verify, owner)
        committed = {k for r in prior for k in r.keys}
        todo = [it for it in items if it.key not in committed]
        self.leased.append(info.id)
        self.planned += len(todo)
        self.skipped_done += len(items) - len(todo)
        self.truncated += sum(1 for it in todo if it.truncated)
        self.signature_counts[info.signature] = self.signature_counts.get(info.signature, 0) + len(todo)
        self._last = info.signature
        log.info("unit %d: %d items of %s%s", info.id, len(todo), info.signature,
                 f" ({len(committed)} already committed)" if committed else "")
        self.sink.begin_unit(info.id, [it.key for it in todo], prior)
        return [Batch(signature=info.signature, items=chunk, size=size)
                for chunk, size in cut_batches(todo, self.settings.batch_sizes, self.settings.pad_short)]

    def _next_unit(self) -> Optional[UnitInfo]:
        waited = False
        while self.stop is None or not self.stop.reason:
            done = done_units(self.plan_dir)
            left = [u for u in self._order if u.id not in done and u.id not in self.leaser.held]
            if not left:
                return None
            warm = [u for u in left if u.signature == self._last]
            for info in warm + [u for u in left if u.signature != self._last]:
                lease = self.leaser.try_take(info.id)
                if lease is None:
                    continue
                self._check_plan_unchanged()
                if info.id in done_units(self.plan_dir):  # finished between our listing and our lease
                    self.leaser.release(info.id)
                    continue
                return info
            if not self.settings.wait:
                log.info("%d unit(s) left, all leased by other workers; exiting (job.wait_for_leases=false)", len(left))
                return None
            if not waited:
                holders = live_leases(self.plan_dir)
                log.info("%d unit(s) left, leased by other workers (%s); waiting for them or their expiry",
                         len(left), "; ".join(h.describe() for h in holders[:3]))
                waited = True
            time.sleep(min(self.leaser.ttl_s / 4, 5.0))
        return None
