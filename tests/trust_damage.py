"""Random damage to a finished output, for the property tests (tests/test_trust_property.py).

One seeded trial picks one of: truncate, delete, flip (one byte), copy (a shard to a free shard
name of its unit, with or without its manifest) or a foreign drop (a shard of another run, with
or without its manifest), on one of the run's files: a tar, its parquet or stats, its manifest,
a done marker, the index, run.json. `apply` works on a local folder through `Files`, or on a
bucket through the same interface (tests/test_trust_property.py's S3Files).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List, Protocol

KINDS = ("truncate", "delete", "flip", "copy", "foreign")


class Files(Protocol):
    def names(self) -> List[str]: ...
    def read(self, name: str) -> bytes: ...
    def write(self, name: str, data: bytes) -> None: ...
    def delete(self, name: str) -> None: ...


class LocalFiles:
    """The files of a local folder, by relative name."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def names(self) -> List[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def write(self, name: str, data: bytes) -> None:
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        (self.root / name).write_bytes(data)

    def delete(self, name: str) -> None:
        (self.root / name).unlink()


def targets(names: List[str]) -> List[str]:
    """The run's files damage may hit: shards, sidecars, manifests, done markers, the index, run.json."""
    return [n for n in names if (n.startswith("shard-") or n.startswith("_manifest/shard-")
                                 or n.startswith("_plan/done/unit-") or n in ("index.wids.json", "run.json"))]


def _free_shard_name(names: List[str], like: str) -> str:
    unit = like[: len("shard-u0000000-")]
    i = 0
    while f"{unit}{i:04d}.tar" in names or f"_manifest/{unit}{i:04d}.tar.json" in names:
        i += 1
    return f"{unit}{i:04d}.tar"


def apply(files: Files, seed: int, foreign: Dict[str, bytes]) -> str:
    """One seeded damage; returns what it did (for the assertion message). `foreign`: the files of
    another run's shard ({"tar": ..., "manifest": ...})."""
    rng = random.Random(seed)
    names = files.names()
    kind = rng.choice(KINDS)
    if kind in ("copy", "foreign"):
        tars = [n for n in names if n.startswith("shard-") and n.endswith(".tar")]
        like = rng.choice(tars)
        new = _free_shard_name(names, like)
        with_manifest = rng.random() < 0.5
        if kind == "copy":
            files.write(new, files.read(like))
            if with_manifest:
                files.write(f"_manifest/{new}.json", files.read(f"_manifest/{like}.json"))
        else:
            files.write(new, foreign["tar"])
            if with_manifest:
                files.write(f"_manifest/{new}.json", foreign["manifest"])
        return f"seed {seed}: {kind} {like} -> {new}{' with its manifest' if with_manifest else ''}"
    name = rng.choice(targets(names))
    data = files.read(name)
    if kind == "delete" or (kind == "truncate" and len(data) <= 1):
        files.delete(name)
        return f"seed {seed}: delete {name}"
    if kind == "truncate":
        cut = rng.randrange(0, len(data))
        files.write(name, data[:cut])
        return f"seed {seed}: truncate {name} to {cut} of {len(data)} bytes"
    at = rng.randrange(len(data))
    flipped = bytearray(data)
    flipped[at] ^= 1 << rng.randrange(8)
    files.write(name, bytes(flipped))
    return f"seed {seed}: flip a bit of byte {at} of {name}"
