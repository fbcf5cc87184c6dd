"""`python -m jobs.generate [overrides]`: the Hydra entry point, kept thin.

Compose the config (typed schema: typos fail here), turn it into dataclasses (every value
checked), run the job. User errors print one clear message and exit 2; nothing is loaded first.
"""

from __future__ import annotations

import logging
import hydra
from omegaconf import DictConfig

from jobs.config import register_configs, to_typed

log = logging.getLogger("jobs.generate")

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PREEMPTED = 143  # 128 + SIGTERM: not complete; rerun (or requeue) to resume

register_configs()


def main_typed(cfg) -> int:
    from jobs.dataset import DatasetError
    from jobs.run import run_job

    try:
        stats = run_job(cfg)
    except DatasetError as e:
        log.error("%s", e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_PREEMPTED if stats.status == "preempted" else 0


@hydra.main(version_base="1.3", config_path="../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    # Hydra drops a task's return value, so a failing job exits here with its own code.
    code = run_from_dict(cfg)
    if code:
        raise SystemExit(code)


def run_from_dict(cfg: DictConfig) -> int:
    from omegaconf.errors import MissingMandatoryValue

    try:
        typed = to_typed(cfg)
    except MissingMandatoryValue as e:
        log.error("config error: %s is required and has no value; pass %s=... on the command line",
                  e.full_key, e.full_key)
        return EXIT_USAGE
    except ValueError as e:
        log.error("config error: %s", e)
        return EXIT_USAGE
    try:
        return main_typed(typed)
    except ValueError as e:  # bad user input found before any model loaded
        log.error("%s", e)
        return EXIT_USAGE


if __name__ == "__main__":
    main()
