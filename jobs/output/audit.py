"""What `python -m jobs.verify` checks: every shard a job committed against its manifest, the
index against the manifests, and every sample read back with webdataset.

Checks, for every shard: its manifest exists and the shard matches it (size, members from the tar
headers, sha256), and so do its parquet and stats (sizes, sha256; the parquet's keys are the shard's,
and no parquet or stats file is without its shard); for the index: it lists exactly the manifests'
shards with their counts, sizes and hashes; every done marker is whole (its own digest); then every
sample is read back with webdataset (the reader users have): each has its json, txt and image (or
video), its key is the one the manifest lists there, and no key is in two shards. A `.tar` with no
manifest, or a parquet no manifest names (a copy, `x.parquet`, one in a subfolder), is listed apart,
not the run's: a glob of output_dir, or pyarrow's folder discovery, would read its samples twice.
Read-only: it moves and rewrites nothing (a rerun of the job quarantines and regenerates).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from jobs.errors import UserError
from jobs.output.claim import identity_id, run_id, run_lineage
from jobs.output.done import read_marker
from jobs.output.layout import DONE_DIR, INDEX_FILE, LOG_DIR, MANIFEST_DIR, PLAN_DIR, PLAN_FILE, RUN_FILE
from sinks.manifest import is_shard_name, load_manifest, verify_shard
from sinks.sidecars import PARQUET_SUFFIX, STATS_SUFFIX, check_sidecars, sidecar_names

IMAGE_EXTS = ("jpg", "png", "webp")
MEDIA_EXTS = (*IMAGE_EXTS, "mp4")  # each sample holds its image, or its video (sinks/video.py)
PROBLEMS_SHOWN = 200


@dataclass
class Report:
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    foreign: List[str] = field(default_factory=list)  # in output_dir, not the run's: left alone, never indexed
    shards: int = 0
    samples: int = 0
    planned: Optional[int] = None  # the plan's items (_plan/plan.json), None where there is no readable plan

    def completeness(self) -> str:
        """Whether the run is done: verify's exit says what is committed is sound, not that it is all there."""
        if self.planned is None:
            return "no readable plan to count against"
        if self.samples >= self.planned:
            return f"the run is complete ({self.planned} of {self.planned} planned items)"
        return (f"the run is NOT complete: {self.samples} of {self.planned} planned items committed (rerun the job's "
                f"command to finish it)")


def verify_output(output_dir: Path) -> Report:
    if not output_dir.is_dir():
        raise UserError(f"OUTPUT_DIR={str(output_dir)!r} is not a directory; give the output_dir of a job")
    report = Report()
    fix = RepairAdvice(output_dir)
    run = _run_id(output_dir, report, fix)
    lineage = run_lineage(output_dir)  # an extended run's earlier ids
    manifests = {}
    unreadable = []  # the run's too: its shard and sidecars are no stray
    for path in sorted((output_dir / MANIFEST_DIR).glob("*.tar.json")):
        url = path.name[: -len(".json")]
        record = load_manifest(output_dir, url)
        if record is None:
            unreadable.append(url)
            report.problems.append(f"{path}: unreadable manifest ({fix.plain})")
        elif run and record.run and record.run != run and record.run not in lineage:
            report.foreign.append(f"{url}: its manifest is another run's (run {record.run}, this run is {run})")
        elif not (output_dir / url).is_file():
            report.problems.append(f"{url}: listed by {path.name} but the shard is missing ({fix.plain}: it "
                                   f"generates its {record.nsamples} samples again)")
        else:
            manifests[url] = record
    for path in sorted(output_dir.glob("*.tar")):
        if path.name not in manifests and not (output_dir / MANIFEST_DIR / f"{path.name}.json").exists():
            report.foreign.append(f"{path.name}: a .tar with no manifest: not written by this run (its manifests "
                                  f"come before their shards), so it is not in the index")
    if manifests and not (output_dir / "run.json").exists():
        report.problems.append(f"run.json is missing ({fix.plain}: it restores it from _plan/plan.json)")
    good = {}
    for url, record in manifests.items():
        differences = verify_shard(output_dir, record, "full")
        if differences:
            how = fix.plain if fix.plain_sees(record) else fix.full
            report.problems.append(f"{url}: does not match its manifest: {'; '.join(differences)} ({how}: it moves "
                                   f"the shard to _quarantine/ and generates its samples again)")
        else:
            good[url] = record
    _check_sidecars(output_dir, good, report, fix)
    _check_stray_sidecars(output_dir, [*manifests, *unreadable], report, fix)
    _check_index(output_dir / INDEX_FILE, manifests, report, fix)
    owners: Dict[str, str] = {}
    for url, record in good.items():
        _read_back(output_dir / url, record, owners, report)
    _check_planned_keys(output_dir, owners, report, fix)
    temps = sorted(p.name for p in output_dir.glob(".shard-*.tmp"))
    if temps:
        report.notes.append(f"{len(temps)} shard temp file(s) ({temps[0]}, ...): a job is writing, or one was killed "
                            f"(its rerun removes them)")
    report.shards = len(manifests)
    report.planned = _planned_items(output_dir)
    if report.planned is None and manifests and _planned_run(output_dir):
        report.problems.append(f"{PLAN_DIR}/{PLAN_FILE} is missing or unreadable, so no rerun can match the committed "
                               f"samples to units ({fix.replan}: it plans again and restores the plan when the new "
                               f"one is this run's, keeping every committed shard)")
    return report


def _plan_doc(output_dir: Path) -> dict:
    """_plan/plan.json read as JSON (output/ reads no planner code); {} without a readable one."""
    try:
        doc = json.loads((output_dir / PLAN_DIR / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _planned_items(output_dir: Path) -> Optional[int]:
    """The plan's item count; None without a readable plan."""
    items = _plan_doc(output_dir).get("items")
    return items if type(items) is int else None


def _run_id(output_dir: Path, report: Report, fix: "RepairAdvice") -> str:
    """The run id its manifests carry (jobs/output/claim.py run_id), or "" with the problem noted. Where
    run.json names another run than plan.json (a flipped bit can leave it valid JSON), the plan's: the
    samples were committed under it, and a rerun restores run.json from it (jobs/plan/publish.py). Read
    by run.json alone, every shard looked like another run's and every key like one to generate again."""
    try:
        rid = run_id(output_dir)
    except FileNotFoundError:
        return ""
    except (OSError, ValueError, AttributeError):
        report.problems.append(f"{RUN_FILE} is unreadable: rerun the job: it restores it from _plan/plan.json "
                               f"when the plan's identity is the job's")
        return ""
    planned = _plan_identity(output_dir)
    if planned is None or identity_id(planned) == rid:
        return rid
    report.problems.append(f"{RUN_FILE} names another run than {PLAN_DIR}/{PLAN_FILE}, under whose identity the "
                           f"samples were committed (damaged or edited; the shards are checked as the plan's run) "
                           f"({fix.plain}: it restores {RUN_FILE} from the plan)")
    return identity_id(planned)


def _planned_run(output_dir: Path) -> bool:
    """Whether output_dir is a job's, which always has a plan: its _plan/ folder is there, or its run.json
    holds an identity. Shards written with the sinks library alone (no plan, no identity) are not asked for one."""
    if (output_dir / PLAN_DIR).is_dir():
        return True
    try:
        return bool(json.loads((output_dir / RUN_FILE).read_bytes()))
    except (OSError, ValueError):
        return False


def _plan_identity(output_dir: Path) -> Optional[dict]:
    """plan.json's identity; None without a readable one."""
    identity = _plan_doc(output_dir).get("identity")
    return identity if isinstance(identity, dict) else None


class RepairAdvice:
    """What repairs a problem: a plain rerun (it sees sizes and stamps), or job.verify=full (sha256).
    The command is the one that made output_dir, from Hydra's record of its overrides, when there."""

    def __init__(self, output_dir: Path):
        self.output_dir = output_dir
        command = _last_command(output_dir)
        self.plain = f"a plain rerun repairs it: {command}" if command else "a plain rerun of the job repairs it"
        self.full = (f"a plain rerun checks sizes and stamps only; this needs sha256: {command} job.verify=full"
                     if command else "a plain rerun checks sizes and stamps only; this needs sha256: rerun the job "
                                     "with job.verify=full")
        self.replan = (f"rerun it with job.verify=full: {command} job.verify=full" if command else
                       "rerun the job's command with job.verify=full")

    def plain_sees(self, record) -> bool:
        """Would a plain rerun's stat check (jobs/worker/recheck.py) find that this shard changed?"""
        from sinks.tar_check import file_stamp

        for name, size in [(record.url, record.filesize)] + [(sc[0], sc[1]) for sc in record.sidecars]:
            try:
                st = (self.output_dir / name).stat()
            except OSError:
                return True
            if st.st_size != size or record.stamps.get(name) not in (None, file_stamp(st)):
                return True
        return False


def _last_command(output_dir: Path) -> str:
    """`python -m jobs.generate OVERRIDES output_dir=OUTPUT_DIR` of the newest job Hydra logged under
    output_dir/logs/ that ran on it: a job refused at the door (another config) logs too, and its command
    would be refused again. job.overwrite and job.verify are left out (a repair must not wipe), and output_dir
    is the folder verified (it may have moved since)."""
    import shlex

    runs = sorted((output_dir / LOG_DIR).glob("*/.hydra/overrides.yaml"), key=lambda p: p.parent.parent.name)
    ran = [r for r in runs if _worked_here(r.parent.parent)]
    if not (ran or runs):
        return ""
    try:
        import yaml

        overrides = [str(o) for o in yaml.safe_load((ran or runs)[-1].read_text()) or []
                     if not str(o).startswith(("job.verify=", "job.overwrite=", "output_dir="))]
    except (OSError, ValueError, ImportError):
        return ""
    return "python -m jobs.generate " + " ".join(shlex.quote(o) for o in [*overrides, f"output_dir={output_dir}"])


def _worked_here(log_folder: Path) -> bool:
    """Whether the job of this Hydra log folder joined the run (its worker counted the units left)."""
    try:
        return any("planned items left" in line for line in
                   (log_folder / "generate.log").read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        return False


def _check_planned_keys(output_dir: Path, owners: Dict[str, str], report: Report, fix: RepairAdvice) -> None:
    """Every key of a done unit is in a shard: a unit marked done with samples missing is news."""
    import pyarrow.parquet as pq

    done_dir = output_dir / PLAN_DIR / DONE_DIR
    if not done_dir.is_dir():
        return
    missing = []
    for marker in sorted(done_dir.glob("unit-*.json")):
        if read_marker(marker) is None:
            report.problems.append(f"{PLAN_DIR}/{DONE_DIR}/{marker.name}: unreadable or damaged (its own digest "
                                   f"does not match; {fix.plain}: it rewrites it from the shards' manifests)")
        unit_file = output_dir / PLAN_DIR / (marker.stem + ".parquet")
        try:
            keys = pq.read_table(unit_file, columns=["key"]).column("key").to_pylist()
        except Exception as err:  # noqa: BLE001 - an unreadable unit file is the finding
            report.problems.append(f"{unit_file.name}: unreadable ({type(err).__name__}); rerun the job with "
                                   f"job.verify=full: it rebuilds the plan's files")
            continue
        missing += [k for k in keys if k not in owners]
    if missing:
        report.problems.append(f"{len(missing)} key(s) of done units are in no shard, e.g. {missing[0]!r} "
                               f"({fix.plain}: it generates them)")


def _check_sidecars(output_dir: Path, good: dict, report: Report, advice: RepairAdvice) -> None:
    import pyarrow.parquet as pq

    fix = f"{advice.full}: it rebuilds them from the shard"
    old = [url for url, record in good.items() if not record.sidecars]
    if old:
        report.notes.append(f"{len(old)} shard(s) ({old[0]}, ...) have no parquet/stats in their manifest (written "
                            f"before bcgen wrote them); {fix}")
    for url, record in good.items():
        if not record.sidecars:
            continue
        problems = check_sidecars(output_dir, record.sidecars, "full")
        if not problems:
            parquet = output_dir / sidecar_names(url)[0]
            try:
                keys = pq.read_table(parquet, columns=["key"]).column("key").to_pylist()
            except Exception as err:  # noqa: BLE001 - an unreadable parquet is the finding
                keys = None
                problems.append(f"{parquet.name}: unreadable ({type(err).__name__}: {err})")
            if keys is not None and keys != list(record.keys):
                problems.append(f"{parquet.name}: its keys are not the shard's")
        how = f"{advice.plain}: it rebuilds them from the shard" if advice.plain_sees(record) else fix
        report.problems += [f"{url}: {p} ({how})" for p in problems]


def _check_stray_sidecars(output_dir: Path, urls: List[str], report: Report, advice: RepairAdvice) -> None:
    """Parquet and stats files that no manifest of this run names. Under a shard name whose shard is gone: a
    problem (a rerun quarantines it). Any other (`shard-X copy.parquet`, `x.parquet`, one in a subfolder):
    not the run's, listed apart; a reader of the folder's parquet files would read its rows beside the run's."""
    ours = {name for url in urls for name in sidecar_names(url)}
    for rel in _sidecar_files(output_dir):
        if rel in ours:
            continue
        suffix = PARQUET_SUFFIX if rel.endswith(PARQUET_SUFFIX) else STATS_SUFFIX
        shard = rel[: -len(suffix)] + ".tar"
        if is_shard_name(shard) and not (output_dir / shard).exists():
            report.problems.append(f"{rel}: its shard is missing, so it describes samples that are not "
                                   f"there ({advice.plain}: it moves it to _quarantine/)")
        elif suffix == PARQUET_SUFFIX:
            readers = ("pyarrow.dataset('OUTPUT_DIR') reads" if "/" in rel else
                       "duckdb's read_parquet('OUTPUT_DIR/*.parquet') and pyarrow.dataset('OUTPUT_DIR') read")
            report.foreign.append(f"{rel}: a parquet no manifest names (a copy?): {readers} its rows beside the run's")
        else:
            report.foreign.append(f"{rel}: a stats file no manifest names (a copy?)")


def _sidecar_files(output_dir: Path) -> List[str]:
    """`shard-*_stats.json` at the top, and every `*.parquet` a reader of the folder sees: at the top (a glob)
    and in subfolders pyarrow's discovery walks (all but those named `_*` or `.*`: _plan/'s unit files are
    not read)."""
    found = [p.name for p in output_dir.glob(f"shard-*{STATS_SUFFIX}")]
    for folder, dirs, files in os.walk(output_dir):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        rel = Path(folder).relative_to(output_dir)
        found += [(rel / f).as_posix() for f in files if f.endswith(PARQUET_SUFFIX) and not f.startswith(("_", "."))]
    return sorted(found)


def _check_index(path: Path, manifests: dict, report: Report, fix: RepairAdvice) -> None:
    if not path.exists():
        if manifests:
            report.problems.append(f"{path.name} is missing ({fix.plain}: it writes it)")
        return
    try:
        index = json.loads(path.read_text())
        listed = {s["url"]: s for s in index["shardlist"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        report.problems.append(f"{path.name}: unreadable ({type(err).__name__}: {err}); {fix.plain}: it rewrites it")
        return
    urls = [s["url"] for s in index["shardlist"]]
    for url in sorted({u for u in urls if urls.count(u) > 1}):  # wids would read its samples that many times
        report.problems.append(f"{path.name} lists {url} {urls.count(url)} times: a reader of the index gets each "
                               f"of its samples as often ({fix.plain}: it rewrites the index)")
    if index.get("__kind__") != "wids-shard-index-v1":
        report.problems.append(f"{path.name}: __kind__ is {index.get('__kind__')!r}, expected 'wids-shard-index-v1'")
    for url in sorted(set(listed) - set(manifests)):
        report.problems.append(f"{path.name} lists {url}, which has no manifest or no shard")
    for url in sorted(set(manifests) - set(listed)):
        report.problems.append(f"{path.name} does not list {url} ({fix.plain}: it rewrites the index)")
    for url in sorted(set(listed) & set(manifests)):
        entry, record = listed[url], manifests[url]
        for name in ("nsamples", "filesize", "sha256"):
            if entry.get(name) != getattr(record, name):
                report.problems.append(f"{path.name}: {url} {name} is {entry.get(name)!r}, the manifest says "
                                       f"{getattr(record, name)!r}")


def _read_back(path: Path, record, owners: Dict[str, str], report: Report) -> None:
    import webdataset as wds

    keys = []
    try:
        for sample in wds.WebDataset(str(path), shardshuffle=False, empty_check=False):
            name = f"{path.name}:{sample['__key__']}"
            missing = [ext for ext in ("json", "txt") if ext not in sample]
            if not any(ext in sample for ext in MEDIA_EXTS):
                missing.append("image or video (" + "|".join(MEDIA_EXTS) + ")")
            if missing:
                report.problems.append(f"{name}: no {', '.join(missing)} member")
            if "json" in sample:
                key = json.loads(sample["json"])["key"]
                keys.append(key)
                if key in owners:
                    report.problems.append(f"{name}: key {key!r} is also in {owners[key]}")
                owners.setdefault(key, path.name)
            report.samples += 1
    except Exception as err:  # noqa: BLE001 - any failure to read back is the finding, named with its shard
        report.problems.append(f"{path.name}: webdataset cannot read it back ({type(err).__name__}: {err})")
        return
    if keys != list(record.keys):
        report.problems.append(f"{path.name}: read back {len(keys)} keys, the manifest lists {len(record.keys)} "
                               f"(or in another order)")
