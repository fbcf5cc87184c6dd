"""`python -m jobs.plan [overrides]`: plan a run without generating (the same config as jobs.generate).

Streams the dataset once and writes `output_dir/_plan/` (work units + plan.json), claiming
output_dir for the run; then start any number of `jobs.generate` workers on the same config,
at any time, with torchrun, Slurm/submitit or by hand. Exit 2 on bad config or data.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from jobs.config import GenerateConfig, register_configs, to_typed
from jobs.errors import EXIT_USAGE, UserError

log = logging.getLogger("jobs.plan")

register_configs()


def plan_typed(cfg: GenerateConfig) -> None:
    # Imported here, not at the top: `--help` and Hydra's own errors should not wait for the
    # planner's imports (pyarrow, the families and their diffusers classes).
    from jobs.output.mirror import open_shards
    from jobs.plan.publish import join_or_make_plan
    from jobs.preflight import check_config

    checked = check_config(cfg)
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir, keep_fields=cfg.dataset.keep_fields)
    join_or_make_plan(cfg, shards, checked.divisor)  # an object store: staged, then published


@hydra.main(version_base="1.3", config_path="../../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    # As jobs.generate: only a UserError (bad config, data or environment) is one message and exit 2;
    # anything else is a crash and keeps its traceback.
    try:
        plan_typed(to_typed(cfg))
    except UserError as e:
        log.error("%s", e)
        raise SystemExit(EXIT_USAGE) from None


if __name__ == "__main__":
    main()
