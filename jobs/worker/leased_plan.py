"""The worker's plan: batches of the units its source gives it, one unit at a time, for as long as any is left.

`units()` is what the generation loop iterates: take the next unit from the UnitSource (lease
files on HPC, a Ray driver's feed: jobs/worker/unit_source.py), read its items (one unit in
memory), drop the keys its earlier holders already committed (one glob of the unit's own shards),
cut them into pool-sized batches, register the unit with the sink, yield the unit's batches (a run
of one signature, which the stage pipeline and its capture policy take as a whole).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from jobs.output.done import done_units
from jobs.output.layout import unit_name, unit_shard_glob
from jobs.plan import Batch, Signature, cut_batches
from jobs.plan.units import PlanManifest, UnitInfo, check_unit_file, read_unit
from jobs.worker.unit_sink import UnitSink
from jobs.worker.unit_source import UnitSource
from sinks.owned_scan import Ownership

log = logging.getLogger("jobs.run")


@dataclass
class PlanSettings:
    """How this worker reads and cuts the units it is given (from the config)."""

    batch_sizes: List[int]  # the pool: each unit's items are cut into batches of these sizes
    pad_short: bool  # a tail smaller than every size is padded up (bcg.pad_short_batches)
    dtype: str  # the dtype the units were planned for
    verify: str = "members"  # how a leased unit's committed shards are checked (job.verify)


class LeasedPlan:
    def __init__(self, manifest: PlanManifest, plan_dir: Path, source: UnitSource, sink: UnitSink,
                 settings: PlanSettings):
        self.manifest, self.plan_dir, self.source, self.sink = manifest, plan_dir, source, sink
        self.settings = settings
        done = done_units(plan_dir)
        self.n_items = sum(u.count for u in manifest.units if u.id not in done)  # left at start (progress)
        self.done_at_start = manifest.n_items - self.n_items
        self.units_left = sum(1 for u in manifest.units if u.id not in done)
        # Filled as units are taken, for the summary.
        self.planned = 0
        self.skipped_done = 0
        self.truncated = 0
        self.padding_rows = 0  # dummy rows the cut added to short tails: every stage runs them, the sink drops them
        self.leased: List[int] = []
        self.signature_counts: Dict[Signature, int] = {}
        self._last: Optional[Signature] = None

    def units(self) -> Iterator[List[Batch]]:
        """The batches of each unit this worker is given, a unit at a time (taken when asked for)."""
        while True:
            info = self.source.next_unit(self._last)
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
        # adopt only this run's (its current id, or one it had before an extend), of these keys
        owner = Ownership(self.sink.run, frozenset(it.key for it in items), self.sink.lineage)
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
        batches = [Batch(signature=info.signature, items=chunk, size=size)
                   for chunk, size in cut_batches(todo, self.settings.batch_sizes, self.settings.pad_short)]
        self.padding_rows += sum(b.n_dummy for b in batches)
        return batches
