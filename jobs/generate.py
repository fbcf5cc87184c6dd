"""`python -m jobs.generate [overrides]`: the Hydra entry point, kept thin.

Check the command line (jobs/cli_check.py), compose the config (typed schema: typos fail here),
turn it into dataclasses (every value checked), run the job. This is the one place that catches
UserError (bad config, data or environment): one message, exit 2, no traceback. Anything else is
a crash and keeps its traceback (exit 1).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Dict

import hydra
from omegaconf import DictConfig

from jobs.config import register_configs, to_typed
from jobs.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USAGE, UserError

log = logging.getLogger("jobs.generate")

register_configs()


def main_typed(cfg) -> int:
    # Imported here, not at the top: the command-line check and `--help` run before the worker's
    # imports (torch, diffusers, the families).
    from jobs.worker.run import run_job

    try:
        stats = run_job(cfg)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_PREEMPTED if stats.status == "preempted" else 0


@hydra.main(version_base="1.3", config_path="../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    # Hydra drops a task's return value, so a failing job exits here with its own code.
    code = run_from_dict(cfg)
    if code:
        raise SystemExit(code)


# Each checked job's local output folder -> whether it existed before Hydra ran (cli() fills it):
# a job refused before its claim removes what it made there, and the folder only if it made that.
EXISTED_BEFORE: Dict[Path, bool] = {}


def run_from_dict(cfg: DictConfig) -> int:
    typed = None
    try:
        typed = to_typed(cfg)
        return main_typed(typed)
    except UserError as e:
        log.error("%s", e)
        if typed is not None:
            _leave_nothing(typed)
        return EXIT_USAGE


def _leave_nothing(cfg) -> None:
    """Bad config or dataset: nothing stays in an output_dir no run has claimed (Hydra's log folder
    of this job included; the message is on the terminal)."""
    from hydra.core.hydra_config import HydraConfig

    from jobs.output.claim import remove_unclaimed
    from jobs.output.storage import resolve

    local = resolve(cfg.output_dir, cfg.job.staging_dir).local
    log_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    if log_dir is not None:
        _close_file_logs(log_dir)
    remove_unclaimed(local, log_dir, existed=EXISTED_BEFORE.get(local.absolute(), True))


def _close_file_logs(folder: Path) -> None:
    """Close and drop the log handlers writing into `folder` (Hydra's job log) before it is removed."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for h in list(getattr(logger, "handlers", [])):
            if isinstance(h, logging.FileHandler) and folder in Path(h.baseFilename).parents:
                logger.removeHandler(h)
                h.close()


def cli(argv=None) -> None:
    """The command: check the command line before Hydra runs (and creates folders), then run."""
    from jobs.cli_check import check_command_line, expand_home

    sys.argv[1:] = expand_home(sys.argv[1:] if argv is None else argv)  # Hydra's main reads sys.argv
    try:
        for local in check_command_line(sys.argv[1:]):
            EXISTED_BEFORE[local.absolute()] = local.exists()
    except UserError as e:
        # Hydra has not configured logging yet: give this one message Hydra's log format.
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("%s", e)
        raise SystemExit(EXIT_USAGE) from None
    main()


if __name__ == "__main__":
    cli()
