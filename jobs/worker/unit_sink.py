"""`UnitSink`: the job's sink, one AsyncSink per unit the worker owns, and the unit's commit.

Each unit writes its own shards, `shard-uNNNNNNN-IIII.tar`, so a unit's shards are found by one
glob and no two units (or workers) ever share a shard name. The generation loop sees one sink:
`put` routes a sample by its key to its unit; once every item of the unit is accounted for
(put, or `skip`ped to the NaN ledger), the unit's shards are committed, its done marker is
written and the unit released to its source (its lease, or the Ray driver that handed it out:
jobs/worker/unit_source.py), before the loop asks for the next batch. Committing as soon as
the unit is complete matters: a worker that holds a finished but unmarked unit while it waits for
others' leases would make them wait for it.

A unit whose lease was lost (taken over as expired while this worker stalled) stops being
written: its open shard is dropped, it is never marked done by this worker, and the worker stops
with LeaseLost (one line, exit 75). Every commit first checks the lease (the writer's guard), and
temp names carry the lease's tag, so the stale worker never commits into, nor deletes from, what
its successor writes.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from jobs.output.done import done_path, mark_done
from jobs.output.layout import unit_shard_pattern
from jobs.output.mirror import LocalShards
from jobs.worker.lease import LeaseLost
from jobs.worker.unit_source import UnitSource
from sinks import AsyncSink, Sample, ShardRecord, SinkConfig
from sinks.shard_writer import Owner
from sinks.sidecars import MetaSpec

log = logging.getLogger(__name__)


@dataclass
class _Open:
    sink: AsyncSink
    expected: int
    prior: List[ShardRecord]  # committed by earlier holders of the unit
    accounted: int = 0
    keys: set = field(default_factory=set)


class UnitSink:
    def __init__(self, output_dir: Path, config: SinkConfig, plan_dir: Path, source: UnitSource, owner: str,
                 shards: Optional[LocalShards] = None, run: str = "", lineage: frozenset = frozenset()):
        self.output_dir, self.config, self.plan_dir = Path(output_dir), config, plan_dir
        # Where committed shards are found and what follows a commit (an upload, jobs/output/mirror.py).
        self.shards = shards or LocalShards(self.output_dir, MetaSpec())
        # source: who owns which unit (leases, or a Ray driver); run: the id every manifest carries
        self.source, self.owner, self.run = source, owner, run
        self.lineage = lineage  # the run's earlier ids (job.extend): its shards committed under them are its own
        self._open: Dict[int, _Open] = {}
        self._open_closing: Optional[tuple] = None  # (unit, _Open) while its last shards commit
        self._unit_of: Dict[str, int] = {}
        self._records: List[ShardRecord] = []  # committed by this worker, units closed
        self.units_done: List[int] = []
        self._stats: List[dict] = []

    def begin_unit(self, unit: int, keys: List[str], prior: List[ShardRecord]) -> None:
        """Register a leased unit's items still to write; with none left, mark it done now."""
        if not keys:
            self._mark(unit, prior)
            return
        writer = Owner(run=self.run, temp_tag=self.source.temp_tag(unit), guard=lambda: self.source.check(unit))
        sink = AsyncSink(self.output_dir, self.config, name_pattern=unit_shard_pattern(unit), spec=self.shards.spec,
                         on_commit=self.shards.on_commit, owner=writer)
        self._open[unit] = _Open(sink=sink, expected=len(keys), prior=prior, keys=set(keys))
        for k in keys:
            self._unit_of[k] = unit

    def put(self, sample: Sample) -> None:
        unit = self._unit_of.pop(sample.key)
        u = self._open[unit]
        with self._guarded(unit):
            self.source.check(unit)
            u.sink.put(sample)
            self._account(unit, u)

    def skip(self, key: str, reason: str = "nonfinite") -> None:
        """An item that will not be written (its image went to the NaN ledger): the unit still ends."""
        unit = self._unit_of.pop(key)
        u = self._open[unit]
        with self._guarded(unit):
            self.source.check(unit)
            u.sink.note_failure(key, reason)  # counted in its shard's _stats.json
            self._account(unit, u)

    @contextlib.contextmanager
    def _guarded(self, unit: int):
        """A lost lease (found here, by the heartbeat, or by the writer's guard at a commit): drop
        the unit's open shard, then stop the worker with the one line LeaseLost says."""
        try:
            yield
        except LeaseLost:
            self._drop(unit)
            raise

    def _account(self, unit: int, u: _Open) -> None:
        u.accounted += 1
        if u.accounted == u.expected:
            del self._open[unit]
            self._open_closing = (unit, u)
            records = u.sink.close()  # each commit checks the lease (the writer's guard)
            self._open_closing = None
            self._collect(u.sink, records)
            self.source.check(unit)
            self._mark(unit, u.prior + records)

    def _mark(self, unit: int, records: List[ShardRecord]) -> None:
        records = self.shards.with_manifest_stamps(records)  # the resume check then sees a manifest rewritten
        if mark_done(self.plan_dir, unit, records, self.owner):
            self.shards.on_done(done_path(self.plan_dir, unit))
        self.units_done.append(unit)
        self.source.release(unit)

    def inflight(self) -> Dict[int, int]:
        """Items of each open unit that are committed or on their way (the job's progress)."""
        return {unit: u.accounted + sum(r.nsamples for r in u.prior) for unit, u in self._open.items()}

    @property
    def records(self) -> List[ShardRecord]:
        """Every shard this worker committed, in closed and open units."""
        return self._records + [r for u in self._open.values() for r in u.sink.records]

    def _collect(self, sink: AsyncSink, records: List[ShardRecord]) -> None:
        self._records += records
        self._stats.append(sink.stats())

    def _drop(self, unit: int) -> None:
        u = self._open.pop(unit, None)
        if u is None and self._open_closing is not None and self._open_closing[0] == unit:
            u = self._open_closing[1]
            self._open_closing = None
        if u is not None:
            u.sink.abort()
            self._collect(u.sink, u.sink.records)
            for k in u.keys:
                self._unit_of.pop(k, None)

    def close(self) -> List[ShardRecord]:
        """Commit every complete sample of unfinished units (a stop): they stay leased to nobody,
        so a rerun continues them after their committed shards."""
        try:
            for unit in list(self._open):
                u = self._open.pop(unit)
                if unit in self.source.lost:  # its new holder writes it now
                    u.sink.abort()
                    continue
                self._collect(u.sink, u.sink.close())
        except LeaseLost:
            pass  # that unit's complete samples are its new holder's to write
        finally:
            self.abort()
        return self._records

    def abort(self) -> None:
        for unit in list(self._open):
            u = self._open.pop(unit)
            u.sink.abort()
            self._collect(u.sink, u.sink.records)
        self.source.release_all()

    def stats(self) -> dict:
        out: dict = {}
        for s in self._stats + [u.sink.stats() for u in self._open.values()]:
            for k, v in s.items():
                out[k] = round(out.get(k, 0) + v, 6)
        return out
