"""The dataset room: bounded readers of prompt files and the rules every row must pass.

May import: jobs.errors, and nothing else of jobs/ (jobs/config.py imports it for DatasetConfig).
Files: load (the config node, load_dataset, the bad-row policy and ledger), formats (one reader per
format), lines (bounded line reading), paths (a file, a folder or a brace list), rules (a row ->
a Record or a RowError).
"""

from jobs.dataset.load import (
    BUNDLED_PROMPTS,
    NONFINITE_REASON,
    DatasetConfig,
    LoadResult,
    check_readable,
    dataset_label,
    dataset_sources,
    format_row_errors,
    load_dataset,
    resolve_format,
    resolve_path,
    rewrite_error_ledger,
    write_error_ledger,
)
from jobs.dataset.rules import DatasetError, Record, RowError

__all__ = [
    "BUNDLED_PROMPTS", "NONFINITE_REASON", "DatasetConfig", "DatasetError", "LoadResult", "Record", "RowError",
    "check_readable", "dataset_label", "dataset_sources", "format_row_errors", "load_dataset", "resolve_format",
    "resolve_path", "rewrite_error_ledger", "write_error_ledger",
]
