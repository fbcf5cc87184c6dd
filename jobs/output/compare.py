"""What `python -m jobs.verify OUTPUT_DIR --against OTHER_DIR` compares: two runs, key by key.

A sample is a function of its row (issue 30): the same key made by two runs of one model, tier and
software stack must have the same bytes, whatever the batching, the partition or a resume did. This
reads every committed sample of both outputs (the shards whose manifest is the run's, with
webdataset, the reader users have) and, per key, compares:

- `latent_sha256` from its json: the denoised latents before decoding, the one record that still
  differs where decoded images agree (a near-flat image, or a rounding that lands on the same uint8);
- the sha256 of each member but the json and an mp4: the image, a video's frames (`sink.video_frames`),
  the sound, the caption. The json records how the sample was made (batch size, mode), which may
  differ by design; H.264 bytes are not reproducible across processes on every host (README, Video),
  and the frames and latents are the record of a video.

Keys are identical (every compared digest equal), differing (named with what differs), or missing
on one side. An output whose samples have no `latent_sha256` (made before bcgen recorded it) is
refused: its images alone cannot show that the latents were equal. Read-only; it checks neither
output against its manifests (`python -m jobs.verify DIR` does).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from jobs.errors import UserError
from jobs.output.claim import run_id
from jobs.output.layout import MANIFEST_DIR, RUN_FILE
from sinks.manifest import load_manifest

SKIPPED = ("json", "mp4")  # members not compared (see the module docstring)
SHOWN = 5  # keys named per category


@dataclass
class Side:
    """One output's samples: key -> {"latent_sha256": ..., member extension: sha256 of its bytes}."""

    folder: Path
    samples: Dict[str, Dict[str, str]] = field(default_factory=dict)
    duplicates: List[str] = field(default_factory=list)  # keys read from two shards
    undigested: List[str] = field(default_factory=list)  # "shard:key" of samples without latent_sha256


@dataclass
class Comparison:
    here: Path
    there: Path
    identical: List[str] = field(default_factory=list)
    differing: Dict[str, List[str]] = field(default_factory=dict)  # key -> the digests that differ
    only_here: List[str] = field(default_factory=list)  # keys in OUTPUT_DIR only
    only_there: List[str] = field(default_factory=list)  # keys in OTHER_DIR only
    duplicates: Dict[str, List[str]] = field(default_factory=dict)  # folder -> keys in two of its shards

    @property
    def same(self) -> bool:
        """Every common key identical, none missing on either side (and no key twice in one output)."""
        return not (self.differing or self.only_here or self.only_there or any(self.duplicates.values()))

    def lines(self) -> List[str]:
        out = [f"identical: {len(self.identical)} key(s){_first(self.identical)}"]
        if self.differing:
            shown = [f"{k} ({', '.join(self.differing[k])})" for k in sorted(self.differing)[:SHOWN]]
            more = ", ..." if len(self.differing) > SHOWN else ""
            out.append(f"differing: {len(self.differing)} key(s), e.g. {', '.join(shown)}{more}")
        for keys, folder, other in ((self.only_here, self.here, self.there), (self.only_there, self.there, self.here)):
            if keys:
                out.append(f"missing from {other}: {len(keys)} key(s) that only {folder} has{_first(keys)}")
        for shown_folder, keys in self.duplicates.items():
            if keys:
                out.append(f"{shown_folder}: {len(keys)} key(s) in two of its shards{_first(keys)}; "
                           f"`python -m jobs.verify {shown_folder}` names them")
        return out

    def verdict(self) -> str:
        if self.same:
            return f"{self.here} and {self.there}: every one of {len(self.identical)} key(s) identical"
        return (f"{self.here} and {self.there} differ: {len(self.differing)} differing key(s), "
                f"{len(self.only_here) + len(self.only_there)} missing on one side, {len(self.identical)} identical")


def _first(keys: List[str]) -> str:
    if not keys:
        return ""
    return ", e.g. " + ", ".join(sorted(keys)[:SHOWN]) + (", ..." if len(keys) > SHOWN else "")


def compare_outputs(here: Path, there: Path) -> Comparison:
    """Compare two output_dirs by key (see the module docstring); UserError for a folder that is not a
    run's output, or one without latent digests."""
    a, b = read_side(here), read_side(there)
    cmp = Comparison(here=here, there=there, duplicates={str(here): a.duplicates, str(there): b.duplicates})
    for key in sorted(a.samples.keys() & b.samples.keys()):
        x, y = a.samples[key], b.samples[key]
        differ = [name for name in sorted(x.keys() | y.keys()) if x.get(name) != y.get(name)]
        if differ:
            cmp.differing[key] = differ
        else:
            cmp.identical.append(key)
    cmp.only_here = sorted(a.samples.keys() - b.samples.keys())
    cmp.only_there = sorted(b.samples.keys() - a.samples.keys())
    return cmp


def read_side(folder: Path) -> Side:
    if not folder.is_dir():
        raise UserError(f"{str(folder)!r} is not a directory; give the output_dir of a bcgen job")
    if not (folder / RUN_FILE).is_file():
        raise UserError(f"{folder} has no {RUN_FILE}: it is not the output_dir of a bcgen job (or its run.json was "
                        f"lost: a rerun of its job restores it from _plan/plan.json)")
    side = Side(folder)
    for url in committed_shards(folder):
        _read_shard(folder / url, side)
    if side.undigested:
        raise UserError(f"{folder}: {len(side.undigested)} sample(s) have no latent_sha256 "
                        f"(e.g. {side.undigested[0]}): they were made before bcgen recorded the digest of each "
                        f"sample's latents, so equal images there prove little. Regenerate that run with this version "
                        f"of bcgen (a new output_dir, or job.overwrite=true) and compare again")
    return side


def committed_shards(folder: Path) -> List[str]:
    """The shards this output's run committed: a manifest of its run, and the shard beside it."""
    run = run_id(folder)
    urls = []
    for path in sorted((folder / MANIFEST_DIR).glob("*.tar.json")):
        record = load_manifest(folder, path.name[: -len(".json")])
        if record is not None and (not record.run or record.run == run) and (folder / record.url).is_file():
            urls.append(record.url)
    return urls


def _read_shard(path: Path, side: Side) -> None:
    import webdataset as wds

    for sample in wds.WebDataset(str(path), shardshuffle=False, empty_check=False):
        meta = json.loads(sample["json"])
        key = meta["key"]
        digests = {ext: hashlib.sha256(data).hexdigest() for ext, data in sample.items()
                   if not ext.startswith("__") and ext not in SKIPPED and isinstance(data, bytes)}
        if not meta.get("latent_sha256"):
            side.undigested.append(f"{path.name}:{key}")
        digests["latent_sha256"] = meta.get("latent_sha256") or ""
        if key in side.samples:
            side.duplicates.append(key)
            continue
        side.samples[key] = digests
