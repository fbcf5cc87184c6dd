"""Check a committed shard against what was true when it was committed.

A shard's manifest (`_manifest/NAME.json`) records its size, sha256 and member list (names and
sizes) at commit time. A committed shard is never rewritten, so any difference means the bytes
changed afterwards (a bad disk, a truncated copy, a hand edit):

- `members` (cheap: one stat and the tar headers, no payload read): the file size, and each
  member's name and size as the tar headers give them, in order. Catches truncation, lost or
  extra members and damaged headers; a flipped byte inside an image passes.
- `full`: also the sha256 of every byte. Catches any change.

A shard with no manifest (its writer died between the commit and the manifest write) is checked
for the layout every shard has: a complete tar (end blocks, padded to a record) whose samples
each hold a json. The problems come back as text; what to do about them is the caller's policy.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Sequence, Set, Tuple

Member = Tuple[str, int]
LEVELS = ("members", "full")
_ZERO_BLOCK = bytes(tarfile.BLOCKSIZE)
_PLAIN_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)


def file_stamp(st: os.stat_result) -> str:
    """What says a file was rewritten since its commit, from one stat: its mtime in ns. A committed
    shard is never rewritten, so a stamp that moved (with the same size) means bytes may have
    changed in place; only then is the file read again (`check_against_manifest` with `full`)."""
    return str(st.st_mtime_ns)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tar_members(path: Path) -> Tuple[List[Member], int]:
    """(name, size) of every member from the headers alone, and the offset where the last one ends.
    Raises tarfile.TarError / OSError when the file is not a readable tar.

    Headers are parsed here rather than by tarfile, which costs several times more per member:
    a resume checks every committed member this way. Shards this package writes are plain USTAR;
    anything else (PAX or GNU long names) goes through tarfile."""
    members: List[Member] = []
    with open(path, "rb") as f:
        filesize = os.fstat(f.fileno()).st_size
        offset = 0
        while True:
            if offset + tarfile.BLOCKSIZE > filesize:
                raise tarfile.ReadError(
                    f"unexpected end of data: the file ends at byte {filesize}, inside member {len(members) - 1}"
                    if offset > filesize else f"unexpected end of data: no end-of-archive block at byte {offset}")
            f.seek(offset)  # within the read buffer for small members: no system call
            header = f.read(tarfile.BLOCKSIZE)
            if header == _ZERO_BLOCK:
                return members, offset
            if header[156:157] not in _PLAIN_TYPES:
                return _tarfile_members(path)
            try:
                stored = int(header[148:156].strip(b" \0") or b"0", 8)
                size = int(header[124:136].strip(b" \0") or b"0", 8)
            except ValueError:
                raise tarfile.ReadError(f"invalid header at byte {offset}") from None
            if stored != sum(header[:148]) + 8 * 32 + sum(header[156:]):
                raise tarfile.ReadError(f"bad header checksum at byte {offset}")
            name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = header[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
            members.append((name, size))
            offset += tarfile.BLOCKSIZE + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _tarfile_members(path: Path) -> Tuple[List[Member], int]:
    with tarfile.open(path, mode="r:") as tar:
        members = [(m.name, m.size) for m in tar]  # seeks over payloads: headers only
        end = tar.offset
    return members, end


def closed_size(end: int) -> int:
    """The size of a tar whose last member ends at `end`: two zero blocks, padded to a record."""
    record = tarfile.RECORDSIZE
    return -(-(end + 2 * tarfile.BLOCKSIZE) // record) * record


def check_against_manifest(path: Path, filesize: int, members: Sequence[Sequence[Any]], sha256: str, level: str,
                           stamp: str | None = None) -> List[str]:
    """What differs between the shard at `path` and its manifest's facts; [] when nothing does.
    `members`: the manifest's [name, size] pairs, as its JSON holds them.
    A `stamp` recorded at commit that no longer matches (rewritten in place) adds the sha256 check."""
    assert level in LEVELS, level
    try:
        st = path.stat()
    except OSError as err:
        return [f"cannot be read ({err.strerror})"]
    size = st.st_size
    if stamp is not None and file_stamp(st) != stamp:
        level = "full"
    problems = []
    if size != filesize:
        problems.append(f"file size {size} bytes, manifest says {filesize}")
    if members:  # manifests written before member lists were recorded have none
        try:
            found, _ = tar_members(path)
        except (OSError, tarfile.TarError) as err:
            problems.append(f"cannot be read as a tar ({type(err).__name__}: {err})")
        else:
            problems += _member_differences(found, [tuple(m) for m in members])
    if level == "full" and not problems and sha256_file(path) != sha256:
        problems.append("sha256 differs from the manifest's (same size and members: payload bytes changed)")
    return problems


def _member_differences(found: List[Member], expected: List[Tuple[Any, ...]]) -> List[str]:
    if found == expected:
        return []
    for i, (a, b) in enumerate(zip(found, expected)):
        if a != b:
            return [f"member {i} is {a[0]!r} ({a[1]} bytes), manifest says {b[0]!r} ({b[1]} bytes)"]
    if len(found) < len(expected):
        missing = ", ".join(name for name, _ in expected[len(found):][:3])
        return [f"{len(found)} members, manifest lists {len(expected)}: missing {missing}"
                + (" ..." if len(expected) - len(found) > 3 else "")]
    return [f"{len(found)} members, manifest lists {len(expected)}: extra {found[len(expected)][0]!r}"]


def check_layout(path: Path) -> List[str]:
    """For a shard without a manifest: is it a complete tar whose every sample has a json?"""
    try:
        members, end = tar_members(path)
        size = path.stat().st_size
    except (OSError, tarfile.TarError) as err:
        return [f"cannot be read as a tar ({type(err).__name__}: {err})"]
    problems = []
    if not members:
        problems.append("holds no members")
    if size != closed_size(end):
        problems.append(f"file size {size} bytes, but its members end at byte {end}: a complete shard is "
                        f"{closed_size(end)} bytes (truncated or appended to)")
    stems: Dict[str, Set[str]] = {}
    for name, _ in members:
        stems.setdefault(name.split(".", 1)[0], set()).add(name.split(".", 1)[-1])
    no_json = [stem for stem, exts in stems.items() if "json" not in exts]
    if no_json:
        problems.append(f"{len(no_json)} sample(s) without a json member, e.g. {no_json[0]!r}")
    return problems
