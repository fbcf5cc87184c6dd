"""What `python -m jobs.verify` checks: every shard a job committed against its manifest, the
index against the manifests, and every sample read back with webdataset.

Checks, for every shard: its manifest exists and the shard matches it (size, members from the tar
headers, sha256), and so do its parquet and stats (sizes, sha256; the parquet's keys are the shard's,
and no parquet or stats file is without its shard); for the index: it lists exactly the manifests' shards with their counts, sizes and
hashes; then every sample is read back with webdataset (the reader users have): each has its json,
txt and image (or video), its key is the one the manifest lists there, and no key is in two shards. A `.tar`
with no manifest is a problem too: a copy of a shard would be read twice by a glob of output_dir.
Read-only: it moves and rewrites nothing (a rerun of the job quarantines and regenerates).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from jobs.errors import UserError
from jobs.output.layout import INDEX_FILE, MANIFEST_DIR
from sinks.manifest import load_manifest, verify_shard
from sinks.sidecars import PARQUET_SUFFIX, STATS_SUFFIX, check_sidecars, sidecar_names

IMAGE_EXTS = ("jpg", "png", "webp")
MEDIA_EXTS = (*IMAGE_EXTS, "mp4")  # each sample holds its image, or its video (sinks/video.py)
PROBLEMS_SHOWN = 200


@dataclass
class Report:
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    shards: int = 0
    samples: int = 0


def verify_output(output_dir: Path) -> Report:
    if not output_dir.is_dir():
        raise UserError(f"OUTPUT_DIR={str(output_dir)!r} is not a directory; give the output_dir of a job")
    report = Report()
    manifests = {}
    for path in sorted((output_dir / MANIFEST_DIR).glob("*.tar.json")):
        url = path.name[: -len(".json")]
        record = load_manifest(output_dir, url)
        if record is None:
            report.problems.append(f"{path}: unreadable manifest (rerun the job to rebuild it from its shard)")
        elif not (output_dir / url).is_file():
            report.problems.append(f"{url}: listed by {path.name} but the shard is missing (rerun the job to "
                                   f"generate its {record.nsamples} samples again)")
        else:
            manifests[url] = record
    for path in sorted(output_dir.glob("*.tar")):
        if path.name not in manifests and not (output_dir / MANIFEST_DIR / f"{path.name}.json").exists():
            report.problems.append(f"{path.name}: a .tar with no manifest, so it is not in the index: a stray copy "
                                   f"(move it out of output_dir) or a shard whose writer died before its manifest "
                                   f"(rerun the job to check and adopt it)")
    if manifests and not (output_dir / "run.json").exists():
        report.problems.append("run.json is missing: a rerun of the job cannot tell whether it may resume here")
    good = {}
    for url, record in manifests.items():
        differences = verify_shard(output_dir, record, "full")
        if differences:
            report.problems.append(f"{url}: does not match its manifest: {'; '.join(differences)} (rerun the job: "
                                   f"it moves the shard to _quarantine/ and generates its samples again)")
        else:
            good[url] = record
    _check_sidecars(output_dir, good, report)
    _check_index(output_dir / INDEX_FILE, manifests, report)
    owners: Dict[str, str] = {}
    for url, record in good.items():
        _read_back(output_dir / url, record, owners, report)
    temps = sorted(p.name for p in output_dir.glob(".shard-*.tmp"))
    if temps:
        report.notes.append(f"{len(temps)} shard temp file(s) ({temps[0]}, ...): a job is writing, or one was killed "
                            f"(its rerun removes them)")
    report.shards = len(manifests)
    return report


def _check_sidecars(output_dir: Path, good: dict, report: Report) -> None:
    import pyarrow.parquet as pq

    fix = "rerun the job with job.verify=full: it rebuilds them from the shard"
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
        report.problems += [f"{url}: {p} ({fix})" for p in problems]
    for suffix in (PARQUET_SUFFIX, STATS_SUFFIX):
        for path in sorted(output_dir.glob(f"shard-*{suffix}")):
            if not (output_dir / (path.name[: -len(suffix)] + ".tar")).exists():
                report.problems.append(f"{path.name}: its shard is missing, so it describes samples that are not "
                                       f"there (rerun the job with job.verify=full: it moves it to _quarantine/)")


def _check_index(path: Path, manifests: dict, report: Report) -> None:
    if not path.exists():
        if manifests:
            report.problems.append(f"{path.name} is missing (rerun the job to write it)")
        return
    try:
        index = json.loads(path.read_text())
        listed = {s["url"]: s for s in index["shardlist"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        report.problems.append(f"{path.name}: unreadable ({type(err).__name__}: {err}); rerun the job to rewrite it")
        return
    if index.get("__kind__") != "wids-shard-index-v1":
        report.problems.append(f"{path.name}: __kind__ is {index.get('__kind__')!r}, expected 'wids-shard-index-v1'")
    for url in sorted(set(listed) - set(manifests)):
        report.problems.append(f"{path.name} lists {url}, which has no manifest or no shard")
    for url in sorted(set(manifests) - set(listed)):
        report.problems.append(f"{path.name} does not list {url} (rerun the job to rewrite the index)")
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
