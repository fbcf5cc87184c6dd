"""First-sight verdicts kept in a JSON file under the user's cache, one file per environment.

    $BCGEN_CACHE_DIR, else $XDG_CACHE_HOME/bcgen, else ~/.cache/bcgen     (jobs/user_cache.py: the same rule)
        <kind>/verdicts-<digest of the environment>.json

The mechanism two policies share: the fused chains' verdicts (bcg/fusions/cache.py) and the
batch-invariant mode's fast paths (bcg/invariant/kept.py). Each names the environment that decides
the bits its verdicts are about (GPU, library versions, its own sources); a change to any of it is
another file, so every key is decided again. Inside a file, a verdict is keyed by the digest of its
key's repr and holds `ok` plus whatever the policy keeps beside it.

Writes replace the file atomically (a temporary file and os.replace), merged with what is on disk
since it was read; two processes writing at once may drop the other's new verdicts, which only
costs a decision on the next run. An unreadable or torn file is ignored with a warning, and a
folder that cannot be written is too: a cache never fails a job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_DIR = "BCGEN_CACHE_DIR"
_OFF = ("0", "off", "false", "no")


def sources_digest(folder: Path) -> str:
    """sha256 (16 hex digits) of the names and bytes of `folder`'s *.py files: a cache named by it is
    another cache once any of its package's code changes (the fusions' kernels, the mode's canonical ones)."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "bcgen"


def switched_off(variable: str) -> bool:
    """Whether the environment variable turns a cache off (0, off, false, no)."""
    return os.environ.get(variable, "on").strip().lower() in _OFF


def environment_file(kind: str, env: dict) -> Path:
    """The file of one environment: <cache root>/<kind>/verdicts-<digest of env>.json."""
    name = hashlib.sha1(json.dumps(env, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root() / kind / f"verdicts-{name}.json"


def digest(key: Any) -> str:
    return hashlib.sha1(repr(key).encode()).hexdigest()


class VerdictFile:
    """{key digest: {"ok": bool, "what": str, ...}} for one environment, in one JSON file."""

    def __init__(self, path: Path, env: dict | None = None) -> None:
        self.path = path
        self.env = env or {}
        self._verdicts: dict[str, dict] | None = None
        self._lock = threading.Lock()  # the job's stages put verdicts from threads of their own

    def _load(self) -> dict[str, dict]:
        if self._verdicts is None:
            self._verdicts = self._read()
        return self._verdicts

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
            return dict(data.get("verdicts", {}))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as exc:  # unreadable, torn or not an object
            log.warning("bcg: ignoring the verdict cache %s (%s)", self.path, exc)
            return {}

    def entry(self, key: Any) -> dict | None:
        """The kept record of `key` ({"ok": ..., and what was kept beside it}), or None."""
        v = self._load().get(digest(key))
        return v if isinstance(v, dict) and "ok" in v else None

    def get(self, key: Any) -> bool | None:
        v = self.entry(key)
        return None if v is None else bool(v["ok"])

    def put(self, key: Any, ok: bool, what: str, **kept: Any) -> None:
        with self._lock:
            self._put(key, ok, what, kept)

    def _put(self, key: Any, ok: bool, what: str, kept: dict) -> None:
        verdicts = self._load()
        verdicts[digest(key)] = {"ok": ok, "what": what[:300], **kept}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self._read(), **verdicts}  # another process's verdicts since we loaded
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"environment": self.env, "verdicts": merged}, f, indent=0, sort_keys=True, default=str)
            os.replace(tmp, self.path)
            self._verdicts = merged
        except OSError as exc:  # a read-only home: decide again next run, never fail the job
            log.warning("bcg: cannot write the verdict cache %s (%s)", self.path, exc)
