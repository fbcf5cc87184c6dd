"""Prompt datasets: one file of prompts -> validated records with unique, stable keys.

Scope: the `dataset` config node, `load_dataset` and the bad-row policy. The whole file is
read and every row checked before this returns, so a job learns of every bad row before it
loads a model. Readers live in `formats.py`, the per-row rules in `rules.py`; the package's face
(`jobs/dataset/__init__.py`) re-exports the types, the one import callers need.

    result = load_dataset(DatasetConfig(path="prompts.jsonl", on_error="skip"))
    write_error_ledger(out / "errors.jsonl", result.errors)
"""

from __future__ import annotations

import gc
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Sequence

from jobs.dataset.formats import READERS
from jobs.dataset.hf import is_saved_dataset
from jobs.dataset.lines import DEFAULT_MAX_LINE_BYTES
from jobs.dataset.paths import broken_link, check_file, dataset_files
from jobs.dataset.rules import OPTIONAL_FIELDS, DatasetError, Record, RowError, RowValidator, unknown_fields_message

log = logging.getLogger(__name__)

BUNDLED_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"
FORMATS = ("auto", *READERS, "hf")  # hf: a Hugging Face `datasets` dataset (jobs/dataset/hf.py)
ON_ERROR = ("fail", "skip")
ERRORS_SHOWN = 20  # a message longer than a screen gets skimmed; the total is always given
_EXTENSIONS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt", ".csv": "csv",
    ".parquet": "parquet", ".pq": "parquet", ".tar": "wds", ".tgz": "wds", ".tar.gz": "wds",
}


@dataclass
class DatasetConfig:
    """The `dataset` config node: which file of prompts, and what to do with bad rows."""

    path: str = ""
    """The prompt file, a directory of them, or a brace list (`prompts-{000..099}.jsonl`), read in
    sorted order; empty means the bundled set, jobs/data/prompts.jsonl."""
    format: str = "auto"
    """auto | jsonl | txt | csv | parquet | wds | hf. auto picks by extension (.tar is wds), and hf for a
    folder `datasets.Dataset.save_to_disk` wrote; hf also reads a folder of data files or a Hub
    dataset id from the local HF cache (jobs/dataset/hf.py)."""
    split: str = "train"
    """dataset.format=hf: the split of a dataset that has several."""
    on_error: str = "fail"
    """fail: any bad row stops the job before a model loads, listing the bad rows.
    skip: generate the good rows; the bad ones go to errors.jsonl in output_dir."""
    limit: int = 0
    """0 = every row; N = the first N valid rows. Every row is still validated."""
    prompt_field: str = "prompt"
    """The field (JSONL, tar .json) or column (CSV, Parquet) holding the prompt."""
    key_field: str = "key"
    """The field or column holding the key; rows without one get `<file stem>-<line:06d>`."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """A longer line (JSONL, TXT, CSV) or caption (tar, Parquet) is a bad row; memory stays bounded."""
    keep_fields: List[str] = field(default_factory=list)
    """Row fields passed through to each sample's json and parquet (img2dataset's
    save_additional_columns), e.g. [url, style]: any JSON value, kept as the row gives it."""

    def __post_init__(self) -> None:
        # `~` expanded: a quoted `'dataset.path=~/p.jsonl'` or a yaml value is no shell's to expand.
        self.path = os.path.expanduser(self.path) if self.path else self.path
        if self.format not in FORMATS:
            raise DatasetError(f"dataset.format={self.format!r} is not a dataset format; "
                             f"allowed: {', '.join(FORMATS)}")
        if self.on_error not in ON_ERROR:
            raise DatasetError(f"dataset.on_error={self.on_error!r} is not allowed; "
                             f"allowed: {', '.join(ON_ERROR)}")
        if type(self.max_line_bytes) is not int or not 1 <= self.max_line_bytes <= 1 << 30:
            raise DatasetError(f"dataset.max_line_bytes={self.max_line_bytes!r} must be an integer in [1, 2**30] "
                               f"(default {DEFAULT_MAX_LINE_BYTES}, 1 MiB)")
        if type(self.limit) is not int or self.limit < 0:
            raise DatasetError(f"dataset.limit={self.limit!r} must be an integer >= 0 (0 = all rows)")
        for name in ("prompt_field", "key_field"):
            if not getattr(self, name):
                raise DatasetError(f"dataset.{name} is empty; name the field, e.g. "
                                 f"dataset.{name}={name.split('_')[0]}")
        if not self.path and self.format != "auto":
            # `dataset=jsonl` names a format for the user's own file. Its yaml cannot make the path
            # mandatory (OmegaConf keeps the schema's "" over a merged ???), so it is checked here:
            # an empty path would otherwise quietly mean the bundled prompts.
            raise DatasetError(f"dataset.format={self.format} but dataset.path is empty: pass "
                               f"dataset.path=/your/prompts.{self.format}, or leave dataset.format=auto "
                               f"(dataset=bundled, the default) for the bundled prompts")
        self.keep_fields = [str(f) for f in self.keep_fields]
        used = {self.prompt_field, self.key_field, *OPTIONAL_FIELDS}
        for name in self.keep_fields:
            if not name or name in used or self.keep_fields.count(name) > 1:
                raise DatasetError(f"dataset.keep_fields={self.keep_fields!r}: {name!r} is "
                                   + ("empty" if not name else "given twice" if name not in used else
                                      "a field bcgen reads already (it is in every sample's json)")
                                   + "; list each other field once")
        if self.prompt_field == self.key_field:
            raise DatasetError(f"dataset.prompt_field and dataset.key_field are both "
                             f"{self.key_field!r}; they must name different fields")


@dataclass
class LoadResult:
    records: list[Record]
    """The valid rows in file order (the first `limit` of them when a limit is set)."""
    errors: list[RowError] = field(default_factory=list)
    """Every bad row of the file (only non-empty under on_error=skip)."""
    path: str = ""
    format: str = ""


def resolve_path(cfg: DatasetConfig) -> Path:
    return Path(cfg.path) if cfg.path else BUNDLED_PROMPTS


def resolve_format(cfg: DatasetConfig, path: Path) -> str:
    if cfg.format != "auto":
        return cfg.format
    if is_saved_dataset(path):
        return "hf"
    name = path.name.lower()
    for ext in sorted(_EXTENSIONS, key=len, reverse=True):  # .tar.gz before .gz
        if name.endswith(ext):
            return _EXTENSIONS[ext]
    raise DatasetError(f"dataset.path={str(path)!r}: cannot tell the format from the extension; "
                       f"set dataset.format to one of {', '.join(FORMATS[1:])} (known extensions: "
                       f"{', '.join(_EXTENSIONS)})")


def check_readable(path: Path, bundled: bool) -> None:
    if bundled and not path.exists():
        raise DatasetError(f"dataset.path is empty, which means the bundled prompts, but {path} "
                           f"is missing from this install; install from a checkout with "
                           f"`pip install -e .`, or set dataset.path")
    target = broken_link(path)
    if target is not None:
        raise DatasetError(f"dataset.path={str(path)!r} is a symbolic link to {target!r}, which does not exist "
                           f"(moved or deleted, or links that loop); point the link at the file, or dataset.path "
                           f"at the file itself")
    if not path.exists():
        raise DatasetError(f"dataset.path={str(path)!r}: no such file (working directory "
                           f"{os.getcwd()}); give an existing file, or leave dataset.path empty "
                           f"for the bundled prompts")
    check_file(path, str(path))


def dataset_sources(cfg: DatasetConfig) -> list[tuple[Path, str]]:
    """Every file `dataset.path` names (one file, a folder, a brace list), in sorted order, each with
    its format and checked readable before a byte of any is read: the files the planner and
    load_dataset read, in the order that decides keys and the plan."""
    if cfg.path and (cfg.format == "hf" or is_saved_dataset(Path(cfg.path))):
        return [(Path(cfg.path), "hf")]  # one dataset (a folder, a Hub id): open_hf names what is wrong with it
    if cfg.path:
        paths = dataset_files(cfg.path, _EXTENSIONS, any_extension=cfg.format != "auto")
    else:
        paths = [BUNDLED_PROMPTS]
    sources = [(path, resolve_format(cfg, path)) for path in paths]
    for path, _ in sources:
        check_readable(path, bundled=not cfg.path)
    return sources


def dataset_label(cfg: DatasetConfig, paths: Sequence[Path]) -> str:
    """How messages name the dataset: its one file, or `dataset.path (N files)`."""
    return str(paths[0]) if len(paths) == 1 else f"{cfg.path} ({len(paths)} files)"


def load_dataset(cfg: DatasetConfig) -> LoadResult:
    """Read and validate every file. Raises DatasetError for a file that cannot be read, no
    prompts at all, or (under on_error=fail) any bad row."""
    sources = dataset_sources(cfg)
    paths, formats = [p for p, _ in sources], [f for _, f in sources]
    label = dataset_label(cfg, paths)
    records: list[Record] = []
    errors: list[RowError] = []
    keys: dict = {}  # shared by every file's validator: keys are unique across the whole list
    unknown: set = set()
    # A million new records would trigger the cyclic GC thousands of times, and none of
    # them can be garbage: pausing it nearly halves the load time of a large file.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for path, fmt in zip(paths, formats):
            validator = RowValidator(str(path), path.stem, cfg.prompt_field, cfg.key_field, seen=keys,
                                     keep=cfg.keep_fields)
            check = validator.check
            try:
                for line, value in READERS[fmt](path, cfg.prompt_field, cfg.key_field, cfg.max_line_bytes,
                                                keep=cfg.keep_fields):
                    out = check(line, value)
                    if type(out) is Record:
                        records.append(out)
                    else:
                        errors.append(out)
            except OSError as exc:
                raise DatasetError(f"dataset.path={str(path)!r}: cannot read it: "
                                   f"{exc.strerror or exc}") from exc
            unknown |= validator.unknown_fields
    finally:
        if gc_was_enabled:
            gc.enable()
    if unknown:
        log.warning("%s: %s", label, unknown_fields_message(unknown, cfg.prompt_field, cfg.key_field))
    fmt = formats[0] if len(set(formats)) == 1 else "+".join(sorted(set(formats)))
    _apply_policy(cfg, label, records, errors)
    if cfg.limit:
        records = records[: cfg.limit]
    log.info("dataset %s (%s): %d records, %d bad rows%s", label, fmt, len(records), len(errors),
             f", limit {cfg.limit}" if cfg.limit else "")
    return LoadResult(records=records, errors=errors, path=label, format=fmt)


def _apply_policy(cfg: DatasetConfig, label: str, records: list, errors: list) -> None:
    if not records and not errors:
        raise DatasetError(f"dataset.path={label!r} holds no prompts (empty, or blank lines only)")
    if errors and cfg.on_error == "fail":
        raise DatasetError(
            format_row_errors(label, errors)
            + f"\nFix these rows, or set dataset.on_error=skip to generate the {len(records)} "
              f"good rows and write the bad ones to errors.jsonl in output_dir.", errors)
    if not records:
        raise DatasetError(format_row_errors(label, errors)
                           + "\nEvery row is bad, so there is nothing to generate.", errors)


def format_row_errors(label: str, errors: list[RowError], shown: int = ERRORS_SHOWN) -> str:
    """The bad rows as `file:line: reason`, capped at `shown`, with the total."""
    noun = "bad row" if len(errors) == 1 else "bad rows"
    lines = [f"dataset.path={label!r}: {len(errors)} {noun}:"]
    lines += [f"  {error}" for error in errors[:shown]]
    if len(errors) > shown:
        lines.append(f"  ... and {len(errors) - shown} more ({len(errors)} bad rows in total)")
    return "\n".join(lines)


NONFINITE_REASON = "generated image has NaN/Inf values"  # job.on_nonfinite=ledger's entries (jobs/worker/handoff.py)


def generated_entries(path: os.PathLike | str) -> List[str]:
    """The ledger's lines that generation wrote (NaN/Inf images), not the plan's bad rows: a re-plan (job.extend)
    rewrites the bad rows from the dataset, and must keep these, which no plan finds again."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    kept = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn last line: nothing to keep of it
        if isinstance(entry, dict) and entry.get("reason") == NONFINITE_REASON:
            kept.append(line)
    return kept


def rewrite_error_ledger(path: os.PathLike | str, errors: Iterable[RowError]) -> None:
    """The plan's bad rows `errors`, in place of the ledger's earlier ones; generation's entries kept, after them."""
    kept = generated_entries(path)
    Path(path).unlink(missing_ok=True)
    errors = list(errors)
    if errors:  # no bad rows: no ledger, unless generation's entries make one
        write_error_ledger(path, errors)
    if kept:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))


def write_error_ledger(path: os.PathLike | str, errors: Iterable[RowError]) -> None:
    """Append one JSON line {file, line, key, reason} per bad row."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # ensure_ascii: a rejected key may hold a lone surrogate, which has no UTF-8 form.
    text = "".join(json.dumps(error.to_json()) + "\n" for error in errors)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
