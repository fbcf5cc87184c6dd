"""What a front door does when it refuses a job before the job claimed output_dir: leave nothing.

Hydra makes the job's log folder (under output_dir) before any of our code runs, and planning
takes output_dir's locks before the dataset is read; a bad dataset row is found after both. So
each front door (jobs.generate, jobs.plan) notes, before Hydra runs, whether each output folder
existed (`note_existing`), and on a UserError calls `leave_nothing`: that job's log folder,
`logs/`, `_locks/` and the folder itself when the job made it are removed again
(jobs/output/claim.py remove_unclaimed), unless a run owns the folder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Iterable, cast

from jobs.output.claim import remove_unclaimed
from jobs.output.storage import resolve

# Each checked job's local output folder -> whether it existed before Hydra ran. Filled by the
# front door's cli() in this process, read by the same process's task: no state crosses processes.
EXISTED_BEFORE: Dict[Path, bool] = {}


def note_existing(folders: Iterable[Path]) -> None:
    for folder in folders:
        EXISTED_BEFORE[folder.absolute()] = folder.exists()


def leave_nothing(cfg) -> None:
    """Bad config or dataset: nothing stays in an output_dir no run has claimed (the message is on the terminal)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    local = resolve(cfg.output_dir, cfg.job.staging_dir).local
    # Only a Hydra run has a log folder; a composed config (the API, tests) leaves it unset ("???").
    # HydraConfig.get() is annotated as the HydraConf dataclass, but returns the DictConfig node (hydra 1.3).
    hydra_cfg = cast(DictConfig, HydraConfig.get()) if HydraConfig.initialized() else None
    found = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None) if hydra_cfg is not None else None
    log_dir = Path(found) if found else None
    if log_dir is not None:
        close_file_logs(log_dir)
    remove_unclaimed(local, log_dir, existed=EXISTED_BEFORE.get(local.absolute(), True))


def close_file_logs(folder: Path) -> None:
    """Close and drop the log handlers writing into `folder` (Hydra's job log) before it is removed."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for h in list(getattr(logger, "handlers", [])):
            if isinstance(h, logging.FileHandler) and folder in Path(h.baseFilename).parents:
                assert isinstance(logger, logging.Logger)  # a logging.PlaceHolder has no handlers: never here
                logger.removeHandler(h)
                h.close()
