"""`job.extend=true`: add a dataset's new rows to a run already in output_dir, keeping its units.

img2dataset's `extend` mode. The run's dataset grew (rows appended, a larger dataset.limit): the
new dataset is planned as a whole, the rows the run already planned are taken out, and what is
left becomes new units numbered after the run's last one. The run's units, their shards and done
markers stay as they are, so done units are not generated again, and a rerun of the same command
joins the extended run.

Only the dataset may differ (its digest, its row count, dataset.limit); anything else that changes
output bytes is another run (refused, as without extend). A row the run planned must come back
unchanged (prompt, negative prompt, seed, signature, a video's fps, its dataset.keep_fields): an edited
row is refused before a model loads, naming its key, its file:line and what changed; its done shards
and the new ones would otherwise disagree on its bytes or its json. Memory: one entry per planned key.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Tuple

from jobs.dataset.rules import short_repr
from jobs.errors import UserError
from jobs.output.layout import unit_name
from jobs.plan.units import (
    FILE_COLUMN,
    SIGNATURE_COLUMNS,
    PlanManifest,
    UnitInfo,
    item_cost,
    unit_digest,
    write_manifest,
)

EXTENDABLE = ("dataset.", "plan.dataset_limit")  # the identity keys job.extend may see change


def only_dataset_changed(differences: List[str]) -> bool:
    return bool(differences) and all(d.startswith(EXTENDABLE) for d in differences)


def check_files_appended(old: PlanManifest, new: PlanManifest) -> None:
    """A dataset of several files may grow by files sorted after its last one: the run's units record
    each row's file by its index in the file list, which an earlier new file would shift. (One file's
    units record none: it may be moved or renamed, as before datasets of several files.)"""
    if "files" not in old.dataset:
        return
    before = [r["path"] for r in old.dataset["files"]]
    after = [r["path"] for r in new.dataset.get("files") or [new.dataset]]
    if after[:len(before)] != before:
        changed = next((i for i, p in enumerate(before) if i >= len(after) or after[i] != p), len(before))
        raise UserError(f"job.extend=true: the dataset's files are not the run's files plus new ones after them "
                        f"(file {changed + 1} was {before[changed]!r}, now "
                        f"{after[changed] if changed < len(after) else 'none'!r}); extend adds files sorted after "
                        f"the last planned one ({before[-1]!r}). Name the new files so they sort last, or use "
                        f"another output_dir")


# What a planned row must keep, each column with the name a refusal gives it: every one reaches the row's
# bytes or its json. `fps` only where the row is a video (frames > 1): an image plays at no rate.
# `extra` (dataset.keep_fields) is in the plans that keep fields, `fps` in those planned since videos.
COMPARED = (("prompt", "prompt"), ("negative_prompt", "negative prompt"), ("seed", "seed"),
            *((c, c) for c in SIGNATURE_COLUMNS), ("fps", "fps"), ("extra", "kept fields (dataset.keep_fields)"))
_COLUMNS = [c for c, _ in COMPARED]
_FPS = _COLUMNS.index("fps")


def _row_key(row: dict) -> tuple:
    values = [row.get(c) for c in _COLUMNS]  # a column the unit file lacks: None, as it was planned
    if row["frames"] <= 1:  # a signature column: in every unit file
        values[_FPS] = None
    return tuple(values)


def _planned(plan_dir: Path, manifest: PlanManifest) -> Dict[str, tuple]:
    import pyarrow.parquet as pq

    out: Dict[str, tuple] = {}
    for u in manifest.units:
        path = plan_dir / f"{unit_name(u.id)}.parquet"
        names = set(pq.read_schema(path).names)
        for row in pq.read_table(path, columns=["key", *(c for c in _COLUMNS if c in names)]).to_pylist():
            out[row["key"]] = _row_key(row)
    return out


def _edited(row: dict, before: tuple, after: tuple, files: List[str]) -> UserError:
    """The refusal of a planned row that changed: its key, its file:line and each value it changed."""
    changes = [f"{label} {short_repr(a)} -> {short_repr(b)}"
               for (_, label), a, b in zip(COMPARED, before, after) if a != b]
    where = f"{files[row.get(FILE_COLUMN) or 0]}:{row['line']}"
    return UserError(f"job.extend=true: the row with key {row['key']!r} at {where} was planned with other values "
                     f"({'; '.join(changes)}); extend adds rows and changes none, and the run's shards hold the "
                     f"planned ones. Restore the row, or use another output_dir (job.overwrite=true starts over)")


def extend_plan(old: PlanManifest, plan_dir: Path, new: PlanManifest, work: Path) -> Tuple[PlanManifest, int]:
    """Move the new rows' units from `work` into `plan_dir` and return (the extended manifest, rows added).
    The caller holds the plan lock and has checked that no worker holds a lease."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    planned = _planned(plan_dir, old)
    seen = set()
    next_id = max((u.id for u in old.units), default=-1) + 1
    added: List[Tuple[UnitInfo, object]] = []
    truncated = 0
    for u in new.units:
        table = pq.read_table(work / f"{unit_name(u.id)}.parquet")
        keys = table.column("key").to_pylist()
        is_old = [k in planned for k in keys]
        for row in table.filter(is_old).to_pylist():
            after = _row_key(row)
            if planned[row["key"]] != after:
                raise _edited(row, planned[row["key"]], after, new.source_files)
            seen.add(row["key"])
        fresh = table.filter(pc.invert(is_old)) if any(is_old) else table
        if fresh.num_rows:
            info = UnitInfo(id=next_id, signature=u.signature, count=fresh.num_rows,
                            cost=fresh.num_rows * item_cost(u.signature))
            added.append((info, fresh))
            truncated += sum(fresh.column("truncated").to_pylist())
            next_id += 1
    gone = len(planned) - len(seen)
    if gone:
        missing = sorted(set(planned) - seen)[:5]
        raise UserError(f"job.extend=true: {gone} row(s) the run planned are not in the dataset any more (keys "
                        f"{', '.join(map(repr, missing))}{' ...' if gone > 5 else ''}); extend adds rows and removes "
                        f"none. Use the dataset the run was planned from plus the new rows, or another output_dir")
    for info, table in added:  # unit files first, plan.json last: a crash leaves the old plan readable
        tmp = plan_dir / f".{unit_name(info.id)}.parquet.tmp-{os.getpid()}"
        pq.write_table(table, tmp)
        os.replace(tmp, plan_dir / f"{unit_name(info.id)}.parquet")
    units = old.units + [info for info, _ in added]
    signatures: Dict[str, int] = {}
    for u in units:
        signatures[str(u.signature)] = signatures.get(str(u.signature), 0) + u.count
    n_added = sum(info.count for info, _ in added)
    dataset = dict(new.dataset, records=old.n_items + n_added)
    digests = dict(old.unit_digests, **{str(info.id): unit_digest(plan_dir / f"{unit_name(info.id)}.parquet")
                                        for info, _ in added})  # the new units are checked on lease as the old
    manifest = replace(old, identity=new.identity, dataset=dataset, units=units, truncated=old.truncated + truncated,
                       signatures=signatures, unit_digests=digests, lineage=old.lineage_with_own_id())
    write_manifest(plan_dir, manifest)
    shutil.rmtree(work, ignore_errors=True)
    return manifest, n_added
