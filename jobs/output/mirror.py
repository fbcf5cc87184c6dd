"""Keep an object-store output_dir in step with its local staging folder (jobs/output/storage.py).

Order is what makes the remote safe to resume from:

    start (rank 0, under a lock)   hydrate: the remote's run.json, plan.json, batching.json and done
                                   markers come down into the staging folder (a staging folder of
                                   another run is cleared first), then the plan is joined or made as
                                   for a local output_dir, then published: units, plan.json, run.json last
    batch sizes chosen             _plan/batching.json uploaded by the worker that published it
                                   (jobs/worker/batch_sizer.py), before any shard made with its sizes
    each unit leased               its unit file fetched (if not staged), its shards scanned
    each shard                     committed locally, then uploaded: tar, parquet, stats, manifest
                                   (sinks/remote.py), then its local payload removed
    each unit                      its shards uploaded, then its done marker, then the marker uploaded
    end                            summaries, timelines, the error ledger, the index

So on the remote a manifest means its shard and sidecars are complete, a done marker means its
unit's manifests are there, and run.json means the plan is. A worker that leases a unit first
uploads the unit's shards a killed worker committed locally but had not uploaded, then reads the
unit's committed shards from the remote (sinks/remote.py Remote.scan): nothing is generated twice
and nothing half-uploaded is ever counted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from jobs.errors import UserError
from jobs.kill_hook import KILL_AT_ENV, kill_hook
from jobs.output.claim import PROVENANCE_KEY, identity_id
from jobs.output.layout import (
    BATCHING_FILE,
    DONE_DIR,
    ERRORS_FILE,
    INDEX_FILE,
    PLAN_DIR,
    PLAN_FILE,
    QUARANTINE_DIR,
    QUARANTINE_LOG,
    RUN_DIRS,
    RUN_FILE,
    RUN_FILES,
    SHARD_GLOB,
    SUMMARY_DIR,
    SUMMARY_FILE,
    TIMELINE_DIR,
)
from jobs.output.schema import item_spec
from jobs.output.staging_claim import StagingClaim
from jobs.output.storage import Output, check_shared_staging, resolve
from sinks.atomic import atomic_write_bytes
from sinks.manifest import ShardRecord, scan_output
from sinks.names import MANIFEST_DIR
from sinks.owned_scan import Ownership, scan_owned
from sinks.quarantine import append_log
from sinks.remote import Remote, describe_error, drop_payload
from sinks.sidecars import MetaSpec
from sinks.tar_check import file_stamp

log = logging.getLogger("jobs.output.mirror")

_DONE = f"{PLAN_DIR}/{DONE_DIR}"  # the done markers, as an object-store prefix



class LocalShards:
    """The committed shards of a local output_dir (the scan of resume, sinks/manifest.py)."""

    def __init__(self, output_dir: Path, spec: MetaSpec):
        self.output_dir, self.spec = Path(output_dir), spec

    @property
    def shown(self) -> str:
        """output_dir as the user named it (for logs and summary.json)."""
        return str(self.output_dir)

    def scan(self, tar_glob: str, verify: str,
             owner: Optional[Ownership] = None) -> Tuple[List[ShardRecord], List[dict]]:
        """The committed shards matching `tar_glob`: with an `owner` (a leased unit), only its own run's
        (sinks/owned_scan.py); anything that differs from what was committed goes to _quarantine/."""
        if owner is None:
            result = scan_output(self.output_dir, tar_glob, verify, self.spec)
        else:
            result = scan_owned(self.output_dir, tar_glob, verify, self.spec, owner)
        return result.records, result.quarantined

    def facts(self) -> Dict[str, Tuple[int, str]]:
        """{name: (size, stamp)} of every shard file and manifest (`_manifest/NAME.json`): one listing
        of output_dir and of its manifests and one stat a file, what the resume check of done units reads."""
        files = {}
        for folder, prefix in ((self.output_dir, ""), (self.output_dir / MANIFEST_DIR, f"{MANIFEST_DIR}/")):
            if not folder.is_dir():
                continue
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.name.startswith("shard-") and e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        files[prefix + e.name] = (st.st_size, file_stamp(st))
        return files

    def with_manifest_stamps(self, records: List[ShardRecord]) -> List[ShardRecord]:
        """The records as a done marker lists them: with the stamp of each one's manifest too."""
        out = []
        for r in records:
            name = f"{MANIFEST_DIR}/{r.url}.json"
            st = os.stat(self.output_dir / name)
            out.append(replace(r, stamps={**r.stamps, name: file_stamp(st)}))
        return out

    def claim_staging(self, ttl_s: float) -> Optional[StagingClaim]:
        """A local output_dir holds its own leases: no staging folder to claim."""
        return None

    def on_commit(self, record: ShardRecord) -> None:
        pass

    def on_done(self, unit_marker: Path) -> None:
        pass

    def on_reopen(self, unit_marker: Path) -> None:
        pass

    def fetch_unit(self, unit_file: Path) -> None:
        pass

    def on_plan_file(self, path: Path) -> None:
        pass

    def push_end(self, leader: bool) -> None:
        pass


class Mirror(LocalShards):
    """The shards of an object-store output_dir, staged in `output.local`."""

    def __init__(self, output: Output, spec: MetaSpec):
        assert output.remote is not None
        super().__init__(output.local, spec)
        self.output = output
        self.remote_url: str = output.remote  # Output is frozen: the URL asserted above, typed as one
        self.remote = Remote(output.remote)
        self.pushed = 0  # shards this process uploaded (the kill tests' count)
        # Shards the remote holds with no run.json beside it but a plan (hydrate): the claim counts
        # them as output_dir's own, and restores run.json from the plan only for the plan's identity.
        self.orphaned_shards = 0

    @property
    def shown(self) -> str:
        return self.remote_url

    # -- whole run ---------------------------------------------------------------------------

    def check(self) -> None:
        try:
            self.remote.check_writable()
        except Exception as e:  # noqa: BLE001 - any failure of the store here is the environment's
            raise UserError(describe_error(self.remote_url, e)) from None

    def claim_staging(self, ttl_s: float) -> Optional[StagingClaim]:
        """This worker's marker in the bucket (jobs/output/staging_claim.py): refused while workers of
        another staging folder are live, since both would generate every unit."""
        return StagingClaim(self.remote, self.output_dir, self.remote_url, ttl_s).join()

    def hydrate(self, overwrite: bool) -> Optional[bytes]:
        """Bring the remote run's bookkeeping into the staging folder; returns the remote run.json."""
        remote_run = self.remote.read_bytes(RUN_FILE)
        local_file = self.output_dir / RUN_FILE
        local_run = local_file.read_bytes() if local_file.exists() else None
        if remote_run != local_run and self._staged_anything():
            log.warning("staging folder %s holds %s than %s: clearing it", self.output_dir,
                        "another run" if remote_run else "a run the remote does not have", self.remote_url)
            clear_run(self.output_dir)
        if remote_run is None:
            foreign = self.remote.sizes("", SHARD_GLOB)
            if not foreign or overwrite:
                return None
            if self.remote.read_bytes(f"{PLAN_DIR}/{PLAN_FILE}") is None:
                raise UserError(f"output_dir={self.remote_url!r} holds {len(foreign)} shard(s) but no {RUN_FILE}: "
                                f"they were not written by this tool's run. Use another output_dir, or "
                                f"job.overwrite=true to delete them.")
            # run.json lost, its plan kept: fetch the bookkeeping; the claim decides (claim.py): run.json
            # restored when this job's identity is the plan's, refused otherwise.
            self.orphaned_shards = len(foreign)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        fetched = 0
        # Not the units (fetched when leased: a billion-item plan has 100k+ of them) nor the
        # manifests (a unit's come with its scan, the only time their names matter).
        for prefix, pattern in (("", ERRORS_FILE), (PLAN_DIR, PLAN_FILE), (_DONE, "*.json"),
                                (QUARANTINE_DIR, QUARANTINE_LOG)):
            for name in self.remote.sizes(prefix, pattern):
                if not (self.output_dir / name).exists():
                    self.remote.get(name, self.output_dir / name)
                    fetched += 1
        fetched += self._sync_batching()
        if remote_run is not None:
            (self.output_dir / RUN_FILE).write_bytes(remote_run)
        self._push_missing_markers()
        if fetched:
            log.info("resuming %s: %d file(s) of its plan and done markers fetched into %s", self.remote_url,
                     fetched, self.output_dir)
        return remote_run

    def _staged_anything(self) -> bool:
        d = self.output_dir
        return d.is_dir() and any((d / n).exists() for n in RUN_DIRS + RUN_FILES) or any(d.glob("shard-*"))

    def _sync_batching(self) -> int:
        """The run's batch sizes (jobs/worker/batch_sizer.py) are the remote's once it has them: they decide
        bytes, so a staging folder's own pick (a worker killed before uploading it) yields to them;
        a pick only staged here goes up now. Returns 1 if it was fetched."""
        name = f"{PLAN_DIR}/{BATCHING_FILE}"
        local = self.output_dir / name
        remote = self.remote.read_bytes(name)
        if remote is not None:
            if not local.exists() or local.read_bytes() != remote:
                local.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(local, remote)
                return 1
        elif local.exists():
            self.remote.put(local, name)
        return 0

    def on_plan_file(self, path: Path) -> None:
        """A file this worker published in the plan folder (the batch sizes): uploaded now."""
        self.remote.put(path, f"{PLAN_DIR}/{path.name}")

    def _push_missing_markers(self) -> None:
        """Done markers written here after their shards were uploaded, by a worker killed before it
        uploaded the marker."""
        remote = set(self.remote.sizes(_DONE, "*.json"))
        for path in sorted((self.output_dir / _DONE).glob("unit-*.json")):
            name = f"{_DONE}/{path.name}"
            if name not in remote:
                self.remote.put(path, name)

    def publish_plan(self, remote_run: Optional[bytes]) -> None:
        """After the plan was joined or made: publish it, run.json last. The remote's old files go
        first only when job.overwrite replaced its run (`_replaced`)."""
        local_run = (self.output_dir / RUN_FILE).read_bytes()
        if remote_run == local_run:
            return
        if self._replaced(remote_run, local_run):
            log.warning("job.overwrite=true: deleting the previous run's files in %s", self.remote_url)
            self._wipe_remote()
        names = sorted(p.relative_to(self.output_dir).as_posix() for p in (self.output_dir / PLAN_DIR).glob("unit-*"))
        names += [n for n in (ERRORS_FILE, f"{PLAN_DIR}/{PLAN_FILE}") if (self.output_dir / n).exists()]
        for name in names + [RUN_FILE]:
            self.remote.put(self.output_dir / name, name)
        log.info("plan published to %s (%d file(s))", self.remote_url, len(names) + 1)

    def _replaced(self, remote_run: Optional[bytes], local_run: bytes) -> bool:
        """Whether this job's run.json replaces another run on the remote. Not when the remote's run
        is this one: the same run id, or one of its earlier ids (job.extend rewrote run.json), or,
        where the remote's run.json is missing or damaged (the claim restored it from the plan), the
        id of the remote plan's identity. Bytes alone would say "another run" for each of those, and
        the wipe would delete the very shards the run is resuming."""
        local = json.loads(local_run)
        own = {identity_id(local), *(local.get(PROVENANCE_KEY) or {}).get("lineage", [])}
        theirs = _parsed(remote_run)
        if not isinstance(theirs, dict):  # missing or damaged: what the remote plan says the run was
            plan = _parsed(self.remote.read_bytes(f"{PLAN_DIR}/{PLAN_FILE}"))
            theirs = plan.get("identity") if isinstance(plan, dict) else None
        if isinstance(theirs, dict):
            return identity_id(theirs) not in own
        return remote_run is not None or bool(self.remote.sizes("", SHARD_GLOB))

    def _wipe_remote(self) -> None:
        fs, root = self.remote.fs, self.remote.root
        names = [self.remote.path(n) for n in self.remote.sizes("", "shard-*")]
        names += [self.remote.path(n) for n in RUN_FILES if fs.exists(self.remote.path(n))]
        if names:
            fs.rm(names)
        for d in RUN_DIRS:
            if fs.exists(f"{root}/{d}"):
                fs.rm(f"{root}/{d}", recursive=True)

    def push_end(self, leader: bool) -> None:
        """What a worker leaves at its end: its summary and timeline; the leader also the ledger,
        the quarantine log, summary.json and the index (last: it lists what is there)."""
        names = [p.relative_to(self.output_dir).as_posix()
                 for d in (SUMMARY_DIR, TIMELINE_DIR) for p in sorted((self.output_dir / d).glob("*")) if p.is_file()]
        if leader:
            names += [n for n in (ERRORS_FILE, f"{QUARANTINE_DIR}/{QUARANTINE_LOG}", SUMMARY_FILE, INDEX_FILE)
                      if (self.output_dir / n).exists()]
        for name in names:
            self.remote.put(self.output_dir / name, name)

    # -- shards and units --------------------------------------------------------------------

    def scan(self, tar_glob: str, verify: str,
             owner: Optional[Ownership] = None) -> Tuple[List[ShardRecord], List[dict]]:
        """The unit's committed shards: the remote's, plus those committed here by a worker killed
        before (or while) it uploaded them, uploaded now unless the remote already has their name
        or keys (then they are stale: another staging folder generated those samples meanwhile)."""
        if owner is None:
            local = scan_output(self.output_dir, tar_glob, verify, self.spec)
        else:
            local = scan_owned(self.output_dir, tar_glob, verify, self.spec, owner, staged=True)
        records, quarantined = self.remote.scan(tar_glob, verify, self.output_dir, owner)
        for entry in quarantined:
            append_log(self.output_dir, entry)
        names = {r.url: r for r in records}
        keys = {k for r in records for k in r.keys}
        for record in local.records:
            if record.url in names or keys.intersection(record.keys):
                same = record.url in names and names[record.url].sha256 == record.sha256
                if not same:
                    log.warning("%s, committed here but not uploaded, is stale: the remote already has %s; dropped",
                                record.url, "that name" if record.url in names else "some of its keys")
                drop_payload(self.output_dir, record)
                continue
            log.info("uploading %s, committed here by an earlier run", record.url)
            self.remote.push_shard(self.output_dir, record)
            records.append(record)
            keys.update(record.keys)
        return sorted(records, key=lambda r: r.url), local.quarantined + quarantined

    def facts(self) -> Dict[str, Tuple[int, str]]:
        """As LocalShards.facts, from the bucket: one listing of its shards and one of its manifests."""
        return {**self.remote.listing("", "shard-*"), **self.remote.listing(MANIFEST_DIR, "shard-*.json")}

    def with_manifest_stamps(self, records: List[ShardRecord]) -> List[ShardRecord]:
        listed = self.remote.listing(MANIFEST_DIR, "shard-*.json")
        out = []
        for r in records:
            name = f"{MANIFEST_DIR}/{r.url}.json"
            out.append(replace(r, stamps={**r.stamps, name: listed[name][1]} if name in listed else r.stamps))
        return out

    def fetch_unit(self, unit_file: Path) -> None:
        if not unit_file.exists():
            self.remote.get(f"{PLAN_DIR}/{unit_file.name}", unit_file)

    def on_commit(self, record: ShardRecord) -> None:
        self.pushed += 1
        hook = None
        if KILL_AT_ENV in os.environ:  # kill tests only: die with the tar uploaded, its manifest not
            n = self.pushed
            hook = lambda: kill_hook("upload", n)  # noqa: E731
        self.remote.push_shard(self.output_dir, record, before_manifest=hook)

    def on_done(self, unit_marker: Path) -> None:
        self.remote.put(unit_marker, f"{_DONE}/{unit_marker.name}")

    def on_reopen(self, unit_marker: Path) -> None:
        self.remote.rm([f"{_DONE}/{unit_marker.name}"])


def _parsed(data: Optional[bytes]):
    """A JSON document's value, or None for no bytes or bytes that are not JSON (damaged)."""
    try:
        return json.loads(data) if data is not None else None
    except ValueError:
        return None


def clear_run(folder: Path) -> None:
    """Remove a run's files from a staging folder (never anything else that may live there)."""
    for d in RUN_DIRS:
        shutil.rmtree(folder / d, ignore_errors=True)
    for n in RUN_FILES:
        (folder / n).unlink(missing_ok=True)
    for p in list(folder.glob("shard-*")) + list(folder.glob(".shard-*")):
        p.unlink(missing_ok=True)


def open_shards(output_dir: str, staging_dir: Optional[str], task_count: int = 1, keep_fields=()) -> LocalShards:
    """Where committed shards live: output_dir itself, or an object store mirrored from a staging
    folder, checked to be writable with this environment's credentials. `keep_fields`: the
    dataset fields passed through to every sample (parquet columns after ITEM_SPEC's)."""
    output = resolve(output_dir, staging_dir)
    spec = item_spec(tuple(keep_fields))
    if output.remote is None:
        return LocalShards(output.local, spec)
    check_shared_staging(output, staging_dir, task_count)
    mirror = Mirror(output, spec)
    mirror.check()
    log.info("output_dir %s is an object store: staging in %s, each shard uploaded once committed",
             output.remote, output.local)
    return mirror
