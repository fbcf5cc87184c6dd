"""`python -m jobs.generate [overrides]`: the Hydra entry point, kept thin.

Check the command line (jobs/cli_check.py), compose the config (typed schema: typos fail here),
turn it into dataclasses (every value checked), run the job. This is the one place that catches
UserError (bad config, data or environment): one message, exit 2, no traceback. Anything else is
a crash and keeps its traceback (exit 1).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from jobs.config import register_configs, to_typed
from jobs.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_TEMPFAIL, EXIT_USAGE, UserError, environment_failure
from jobs.refused import leave_nothing, note_existing
from jobs.telemetry import startup
from sinks.errors import SinkError

log = logging.getLogger("jobs.generate")

register_configs()


def main_typed(cfg) -> int:
    # Imported here, not at the top: the command-line check and `--help` run before the worker's
    # imports (torch, diffusers, the families), and Ray is an optional extra.
    if cfg.ray is not None:
        from jobs.cluster.connect import require_ray

        require_ray()
        from jobs.cluster.driver import run_ray_job as run_job
    else:
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


def run_from_dict(cfg: DictConfig) -> int:
    typed = None
    try:
        typed = to_typed(cfg)
        startup.mark("compose")
        return main_typed(typed)
    except UserError as e:
        log.error("%s", e)
        if typed is not None:
            leave_nothing(typed)  # a job refused before its claim leaves nothing in output_dir
        return getattr(e, "exit_code", EXIT_USAGE)  # EnvironmentFailure: 75
    except (SinkError, OSError) as e:
        why = environment_failure(e)
        if why is None:
            raise  # not the environment's: a bug, with its traceback
        log.error("%s", why)
        return EXIT_TEMPFAIL


def cli(argv=None) -> None:
    """The command: check the command line before Hydra runs (and creates folders), then run."""
    from jobs.cli_check import check_command_line, expand_home

    startup.mark("interpreter")  # Python's start and this module's imports (Hydra, the config schema)
    startup.arm()  # this process is the job's own: summary.json times its start-up from the kernel's start of it
    sys.argv[1:] = expand_home(sys.argv[1:] if argv is None else argv)  # Hydra's main reads sys.argv
    try:
        note_existing(check_command_line(sys.argv[1:]))
    except UserError as e:
        # Hydra has not configured logging yet: give this one message Hydra's log format.
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("%s", e)
        raise SystemExit(EXIT_USAGE) from None
    main()


if __name__ == "__main__":
    from jobs.fast_exit import exit_after

    exit_after(cli)  # the interpreter's teardown skipped: 1-2 s of a user's wait, nothing to save
