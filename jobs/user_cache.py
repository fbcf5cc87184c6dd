"""The user's cache folder for bcgen, one rule for every cache the jobs keep (file digests, batch
sizes, rates):

    $BCGEN_CACHE_DIR                       when set (the tests set it: a fresh folder a session)
    $XDG_CACHE_HOME/bcgen                  else, when set (the XDG base directory spec)
    ~/.cache/bcgen                         else

bcg/verdict_file.py:cache_root keeps the fused kernels' and the invariant mode's verdicts under the same
folder by the same rule; it is written out there because bcg imports nothing of jobs (tests/test_user_cache.py holds
the two equal).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

ENV_DIR = "BCGEN_CACHE_DIR"


def user_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get(ENV_DIR):
        return Path(environ[ENV_DIR]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "bcgen"
