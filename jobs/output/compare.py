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
on one side. The keys are streamed into a SQLite file on disk and sorted out there
(jobs/output/key_table.py), so the memory it takes does not grow with the run. An output whose
samples have no `latent_sha256` (made before bcgen recorded it) is refused: its images alone cannot
show that the latents were equal. Read-only; it checks neither output against its manifests
(`python -m jobs.verify DIR` does).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from jobs.errors import UserError
from jobs.output.claim import run_id
from jobs.output.key_table import Keys, KeyTable
from jobs.output.layout import MANIFEST_DIR, RUN_FILE
from sinks.manifest import load_manifest

SKIPPED = ("json", "mp4")  # members not compared (see the module docstring)
SHOWN = 5  # keys named per category


@dataclass
class Undigested:
    """One side's samples without latent_sha256: how many, and the first read ("shard:key")."""

    count: int = 0
    first: str = ""


@dataclass
class Comparison:
    """What the report needs, and no more: each category's count and first SHOWN keys (sorted), so a
    comparison of 10M keys is as small as one of 10 (the keys themselves stay in jobs/output/key_table.py)."""

    here: Path
    there: Path
    identical: Keys = field(default_factory=Keys)
    differing: Keys = field(default_factory=Keys)
    differs_in: Dict[str, List[str]] = field(default_factory=dict)  # first differing keys -> the digests that differ
    only_here: Keys = field(default_factory=Keys)  # keys in OUTPUT_DIR only
    only_there: Keys = field(default_factory=Keys)  # keys in OTHER_DIR only
    duplicates: Dict[str, Keys] = field(default_factory=dict)  # folder -> keys in two of its shards

    @property
    def same(self) -> bool:
        """Every common key identical, none missing on either side (and no key twice in one output)."""
        return not (self.differing or self.only_here or self.only_there or any(self.duplicates.values()))

    def lines(self) -> List[str]:
        out = [f"identical: {len(self.identical)} key(s){_first(self.identical)}"]
        if self.differing:
            shown = [f"{k} ({', '.join(self.differs_in[k])})" for k in self.differing.first]
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


def _first(keys: Keys) -> str:
    if not keys:
        return ""
    return ", e.g. " + ", ".join(keys.first) + (", ..." if len(keys) > SHOWN else "")


def compare_outputs(here: Path, there: Path, scratch: Optional[Path] = None) -> Comparison:
    """Compare two output_dirs by key (see the module docstring); UserError for a folder that is not a
    run's output, or one without latent digests. The keys go to a SQLite file in a temporary folder
    under `scratch` (default: the system's, TMPDIR), removed on return: about 300 bytes a key a side
    (the digests as hex text)."""
    with tempfile.TemporaryDirectory(prefix="bcgen-against-", dir=scratch) as tmp, KeyTable(Path(tmp), SHOWN) as table:
        read_side(here, table, "here")
        read_side(there, table, "there")
        differing, first = table.differing()
        return Comparison(
            here=here, there=there, identical=table.identical(), differing=differing,
            differs_in={key: _differs(a, b) for key, a, b in first},
            only_here=table.only("here"), only_there=table.only("there"),
            duplicates={str(here): table.duplicates("here"), str(there): table.duplicates("there")})


def _differs(a: str, b: str) -> List[str]:
    x, y = json.loads(a), json.loads(b)
    return [name for name in sorted(x.keys() | y.keys()) if x.get(name) != y.get(name)]


def read_side(folder: Path, table: KeyTable, side: str) -> None:
    """Every committed sample of `folder` into `table` as `side`, shard by shard; refused (UserError)
    before anything is compared if some have no latent_sha256."""
    if not folder.is_dir():
        raise UserError(f"{str(folder)!r} is not a directory; give the output_dir of a bcgen job")
    if not (folder / RUN_FILE).is_file():
        raise UserError(f"{folder} has no {RUN_FILE}: it is not the output_dir of a bcgen job (or its run.json was "
                        f"lost: a rerun of its job restores it from _plan/plan.json)")
    undigested = Undigested()
    for url in committed_shards(folder):
        table.add(side, _rows(folder / url, undigested))
    if undigested.count:
        raise UserError(f"{folder}: {undigested.count} sample(s) have no latent_sha256 "
                        f"(e.g. {undigested.first}): they were made before bcgen recorded the digest of each "
                        f"sample's latents, so equal images there prove little. Regenerate that run with this version "
                        f"of bcgen (a new output_dir, or job.overwrite=true) and compare again")
    table.seal(side)


def committed_shards(folder: Path) -> List[str]:
    """The shards this output's run committed: a manifest of its run, and the shard beside it."""
    run = run_id(folder)
    urls = []
    for path in sorted((folder / MANIFEST_DIR).glob("*.tar.json")):
        record = load_manifest(folder, path.name[: -len(".json")])
        if record is not None and (not record.run or record.run == run) and (folder / record.url).is_file():
            urls.append(record.url)
    return urls


def _rows(path: Path, undigested: Undigested) -> Iterator[Tuple[str, str, str]]:
    """(key, its digests as canonical JSON, shard name) of each sample, one sample in memory at a time."""
    import webdataset as wds

    for sample in wds.WebDataset(str(path), shardshuffle=False, empty_check=False):
        meta = json.loads(sample["json"])
        key = meta["key"]
        digests = {ext: hashlib.sha256(data).hexdigest() for ext, data in sample.items()
                   if not ext.startswith("__") and ext not in SKIPPED and isinstance(data, bytes)}
        if not meta.get("latent_sha256"):
            undigested.count += 1
            undigested.first = undigested.first or f"{path.name}:{key}"
        digests["latent_sha256"] = meta.get("latent_sha256") or ""
        # sorted keys, no spaces: equal dicts are equal text, which is what the table compares
        yield key, json.dumps(digests, sort_keys=True, separators=(",", ":")), path.name
