"""`dataset.format=hf`: a Hugging Face `datasets` dataset as prompt rows, offline.

    dataset.path=/data/prompts_ds       a folder `Dataset.save_to_disk` wrote (or a DatasetDict's)
    dataset.path=/data/parquet_folder   a folder of data files `datasets.load_dataset(folder)` reads
    dataset.path=org/prompts            a Hub dataset id: its snapshot in the local HF cache (jobs/hub.py)
    dataset.split=train                 the split of a dataset with several

Rows are the dataset's rows as dicts, checked by the same row rules as every other format; the
line of a row is its index + 1. The dataset's digest (the run's identity) is its `datasets`
fingerprint: it changes when the data does, without a pass over the rows. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterator, Tuple

from jobs.dataset.rules import Bad, DatasetError
from jobs.hub import cached_snapshot, is_repo_id

SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")  # what save_to_disk writes


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in SAVED_MARKERS)


def open_hf(path_text: str, split: str):
    """The `datasets.Dataset` that dataset.path names (see the module docstring)."""
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"dataset.format=hf (dataset.path={path_text!r}) needs Hugging Face's `datasets`, which is "
                           f"not installed: pip install -e '.[hf]'") from None

    path = Path(path_text)
    if is_saved_dataset(path):
        ds = datasets.load_from_disk(str(path))
    else:
        if path.is_dir():
            folder = path
        elif is_repo_id(path_text):
            folder = cached_snapshot(path_text, "dataset", "dataset.path")
        else:
            raise DatasetError(f"dataset.path={path_text!r} (dataset.format=hf) is neither a folder nor a Hub dataset "
                               f"id (org/name) in the local Hugging Face cache; save one with "
                               f"Dataset.save_to_disk(DIR) and pass that folder")
        try:
            # Read when asked (datasets reads HF_DATASETS_CACHE once, at its import): where the Arrow copy goes.
            ds = datasets.load_dataset(str(folder), cache_dir=os.environ.get("HF_DATASETS_CACHE"))
        except (ValueError, FileNotFoundError) as e:
            raise DatasetError(f"dataset.path={path_text!r}: datasets cannot read {folder} ({e}); it needs data "
                               f"files (parquet, jsonl, csv) or a folder Dataset.save_to_disk wrote") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DatasetError(f"dataset.split={split!r} is not a split of dataset.path={path_text!r}; its splits: "
                               f"{', '.join(ds)}; set dataset.split to one of them")
        ds = ds[split]
    return ds


def hf_digest(ds) -> str:
    """The dataset's identity: datasets' fingerprint of its data and transforms, and its length."""
    return hashlib.sha256(f"hf\x00{ds._fingerprint}\x00{len(ds)}".encode()).hexdigest()


def hf_rows(ds, prompt_field: str, max_bytes: int) -> Iterator[Tuple[int, object]]:
    """(line, row dict) per row, line = index + 1; a prompt over max_bytes is a bad row, as in every format."""
    for i, row in enumerate(ds):
        prompt = row.get(prompt_field)
        if isinstance(prompt, str) and len(prompt) > max_bytes // 4 and len(prompt.encode()) > max_bytes:
            yield i + 1, Bad(f"{prompt_field} is {len(prompt.encode())} bytes, over dataset.max_line_bytes={max_bytes}")
            continue
        yield i + 1, row
