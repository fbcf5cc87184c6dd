"""A Hugging Face Hub id (`org/name`) as a local folder: the snapshot the local HF cache holds.

    cached_snapshot("Efficient-Large-Model/Sana_600M_512px_diffusers", "model", "model.path")
        -> ~/.cache/huggingface/hub/models--Efficient-Large-Model--Sana_600M_512px_diffusers/snapshots/<commit>

Offline, always: the job never downloads (huggingface_hub's `local_files_only`). The cache is
HF_HUB_CACHE (or HF_HOME/hub, or ~/.cache/huggingface/hub), read when asked, so the same job
sees the same cache as `hf download` did. The snapshot folder's name is the commit, so the run's
identity, which holds the folder, changes when the cache moves to another revision.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from jobs.errors import UserError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_repo_id(text: str) -> bool:
    """`org/name`, and not a folder that exists here (a relative `a/b` folder wins)."""
    return bool(_REPO_ID.match(text)) and not Path(text).exists() and ".." not in text


def hub_cache() -> Optional[str]:
    return os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME")
                                                else None)


def cached_snapshot(repo_id: str, repo_type: str, key: str, revision: Optional[str] = None) -> Path:
    """The cached snapshot of `repo_id` (`repo_type` model or dataset); UserError naming `key` if absent."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache()
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, cache_dir=cache,
                                      local_files_only=True))
    except LocalEntryNotFoundError:
        fetch = f"hf download {repo_id}" + (" --repo-type dataset" if repo_type == "dataset" else "")
        raise UserError(f"{key}={repo_id!r} is not a folder here, and the Hugging Face cache ({cache or HF_HUB_CACHE}) "
                        f"holds no snapshot of the {repo_type} {repo_id!r}. bcgen never downloads: run `{fetch}` "
                        f"where there is a network (with the same HF_HUB_CACHE or HF_HOME), or pass a local "
                        f"folder") from None
