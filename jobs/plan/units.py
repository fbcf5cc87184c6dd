"""The plan on disk: `output_dir/_plan/plan.json` and signature-pure `unit-NNNNNNN.parquet` files.

The planner writes them once; workers only read them. A unit holds the items of ONE signature
(so a worker captures one graph per unit) in dataset order, with everything a worker needs to
generate them without the dataset: key, prompt, negative prompt, seed, size, frames, fps, steps,
guidance, text tokens and estimated cost. plan.json is small (one entry per unit) and is all a worker
reads at start-up, whatever the dataset's size.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Union

from jobs.errors import UserError
from jobs.output.claim import identity_id
from jobs.output.layout import PLAN_FILE, unit_name
from jobs.plan import Item, Signature
from sinks.atomic import atomic_write_bytes

PLAN_VERSION = 1

# The columns of a unit file (and of the planner's spill files, which add `key_hash`).
SIGNATURE_COLUMNS = ("height", "width", "text_bucket", "steps", "guidance_scale", "cfg", "frames")
ITEM_COLUMNS = ("key", "prompt", "negative_prompt", "seed", "line", "text_tokens", "truncated", "cost", "fps")
# and `extra` (JSON of the row's dataset.keep_fields) in plans that keep fields.
# A dataset of several files: each row's file, an index into plan.json's dataset.files (`line` is that
# file's). Absent for one file, whose units are what they always were.
FILE_COLUMN = "file"


def item_cost(sig: Signature) -> float:
    """Estimated work of one item in megapixel-steps: transformer FLOPs grow ~linearly with
    pixels x frames x steps (x2 rows with CFG). Good enough to balance; not a time estimate."""
    return sig.height * sig.width * sig.frames * sig.steps * (2 if sig.cfg else 1) / 1e6


@dataclass(frozen=True)
class UnitInfo:
    id: int
    signature: Signature
    count: int
    cost: float

    def to_json(self) -> dict:
        return {"id": self.id, "signature": asdict(self.signature), "count": self.count, "cost": round(self.cost, 3)}

    @classmethod
    def from_json(cls, d: dict) -> "UnitInfo":
        return cls(id=d["id"], signature=Signature(**d["signature"]), count=d["count"], cost=d["cost"])


@dataclass
class PlanManifest:
    """plan.json: what was planned from what. `identity` is the run identity (resume.run_identity)."""

    identity: dict
    dataset: dict  # path, format, digest, bytes, mtime_ns, records, bad_rows
    unit_items: int
    units: List[UnitInfo] = field(default_factory=list)
    truncated: int = 0
    signatures: Dict[str, int] = field(default_factory=dict)
    unit_digests: Dict[str, str] = field(default_factory=dict)
    """{unit id: sha256 of its file}, checked whenever a unit is read (a damaged unit file would give
    other seeds or prompts); empty in plans made before digests."""
    weights: dict = field(default_factory=dict)
    """The files under model.path: size, mtime and sha256 each, and their digest, which the run
    identity carries (jobs/plan/weights_digest.py); empty without a model.path, and in plans made
    before weight digests."""
    lineage: List[str] = field(default_factory=list)
    """The run ids this run had before its identity changed (job.extend; the device part settled by its
    first worker), as run.json's provenance lists them: shards committed under them are the run's. Kept
    here too, so that a run.json restored from this plan keeps them; empty in plans made before."""

    @property
    def n_items(self) -> int:
        return sum(u.count for u in self.units)

    def lineage_with_own_id(self) -> List[str]:
        """Its lineage and its identity's run id: the lineage once the identity is changed."""
        return sorted(set(self.lineage) | {identity_id(self.identity)})

    @property
    def source_files(self) -> List[str]:
        """The dataset's files, by the index unit files record (one file: its path)."""
        files = self.dataset.get("files")
        return [f["path"] for f in files] if files else [self.dataset["path"]]

    def to_json(self) -> dict:
        return {"plan_version": PLAN_VERSION, "identity": self.identity, "dataset": self.dataset,
                "unit_items": self.unit_items, "items": self.n_items, "truncated": self.truncated,
                "signatures": self.signatures, "units": [u.to_json() for u in self.units],
                **({"unit_digests": self.unit_digests} if self.unit_digests else {}),
                **({"weights": self.weights} if self.weights else {}),
                **({"lineage": self.lineage} if self.lineage else {})}

    @classmethod
    def from_json(cls, d: dict) -> "PlanManifest":
        if d.get("plan_version") != PLAN_VERSION:
            raise UserError(f"plan.json has plan_version {d.get('plan_version')!r}, this bcgen reads "
                             f"{PLAN_VERSION}; plan again into a new output_dir (or job.overwrite=true)")
        return cls(identity=d["identity"], dataset=d["dataset"], unit_items=d["unit_items"],
                   units=[UnitInfo.from_json(u) for u in d["units"]], truncated=d["truncated"],
                   signatures=d["signatures"], unit_digests=d.get("unit_digests", {}), weights=d.get("weights", {}),
                   lineage=[str(i) for i in d.get("lineage", [])] if isinstance(d.get("lineage", []), list) else [])


class DamagedPlan(UserError):
    """A file of _plan/ that is not what the planner wrote (unreadable, or its digest differs)."""


REPAIR = ("the plan is deterministic, so rerun the same command with job.verify=full: it plans again and "
          "restores the plan's damaged files when the new plan is this run's (nothing committed is touched)")


def read_manifest(plan_dir: Path) -> PlanManifest:
    path = plan_dir / PLAN_FILE
    try:
        return PlanManifest.from_json(json.loads(path.read_bytes()))
    except UserError:
        raise
    except (ValueError, KeyError, TypeError) as err:
        raise DamagedPlan(f"{path} is damaged ({type(err).__name__}: {err}); {REPAIR}") from None


def unit_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_unit_file(plan_dir: Path, manifest: PlanManifest, unit: int) -> None:
    """DamagedPlan when the unit's file is missing or not the one planned."""
    path = plan_dir / f"{unit_name(unit)}.parquet"
    want = manifest.unit_digests.get(str(unit))
    try:
        got = unit_digest(path) if want else None
    except OSError as err:
        raise DamagedPlan(f"{path} cannot be read ({err.strerror}); {REPAIR}") from None
    if want and got != want:
        raise DamagedPlan(f"{path} is not the file the planner wrote (its sha256 differs from plan.json's "
                          f"unit_digests); {REPAIR}")


def write_manifest(plan_dir: Path, manifest: PlanManifest) -> None:
    atomic_write_bytes(plan_dir / PLAN_FILE, (json.dumps(manifest.to_json(), indent=1) + "\n").encode())


def read_unit_keys(plan_dir: Path, info: UnitInfo) -> List[str]:
    """The keys of a unit, in plan order (what its shards may hold)."""
    import pyarrow.parquet as pq

    return pq.read_table(plan_dir / f"{unit_name(info.id)}.parquet", columns=["key"]).column("key").to_pylist()


def read_unit(plan_dir: Path, info: UnitInfo, sources: Union[str, Sequence[str]], dtype: str) -> List[Item]:
    """A unit's items, in plan order, each with its `source` (`file:line`; `sources` are the dataset's
    files, PlanManifest.source_files, or one file's name). Memory: one unit."""
    import pyarrow.parquet as pq

    cols = pq.read_table(plan_dir / f"{unit_name(info.id)}.parquet").to_pydict()
    sig = Signature(**asdict(info.signature))
    assert sig.dtype == dtype, f"unit {info.id} was planned for {sig.dtype}, the job runs {dtype}"
    n = len(cols["key"])
    fps = cols.get("fps") or [None] * n  # units planned before videos have no fps
    extra = cols.get("extra") or [None] * n  # only plans with dataset.keep_fields
    names = [sources] if isinstance(sources, str) else list(sources)
    files = cols.get(FILE_COLUMN) or [0] * n
    return [Item(key=k, prompt=p, negative_prompt=ng, seed=s, signature=sig, text_tokens=t, truncated=tr,
                 source=f"{names[fi]}:{line}", fps=f, extra=x)
            for k, p, ng, s, t, tr, line, f, fi, x in zip(cols["key"], cols["prompt"], cols["negative_prompt"],
                                                            cols["seed"], cols["text_tokens"], cols["truncated"],
                                                            cols["line"], fps, files, extra)]
