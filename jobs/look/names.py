"""What a sample's extracted file is called under images/ (the gallery's and the pages'): never a path a
shard's member name picks."""

from __future__ import annotations

import hashlib
import re

_SAFE = re.compile(r"[A-Za-z0-9_%+=@,-][A-Za-z0-9_%+=@,.-]{0,199}")


def safe_name(stem: str) -> str:
    """A member stem as a file name under images/: the stem itself when it is a plain name (what
    this job writes, sinks/keys.py), else a digest of it. Member names come from the tar, which
    anyone may have crafted (`../../x`, `/etc/y`): nothing read from a shard picks a path."""
    if _SAFE.fullmatch(stem) and ".." not in stem:
        return stem
    return "member-" + hashlib.sha256(stem.encode("utf-8", "surrogateescape")).hexdigest()[:16]
