"""`python -m jobs.plan [overrides]`: plan a run without generating (the same config as jobs.generate).

Streams the dataset once and writes `output_dir/_plan/` (work units + plan.json), claiming
output_dir for the run; then start any number of `jobs.generate` workers on the same config,
at any time, with torchrun, Slurm/submitit or by hand. Exit 2 on bad config or data.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from jobs.config import register_configs

log = logging.getLogger("jobs.plan")

register_configs()


def plan_typed(cfg) -> None:
    from jobs.preflight import check_config
    from jobs.plan.publish import join_or_make_plan
    from jobs.output.mirror import open_shards

    _, _, _, divisor = check_config(cfg)
    join_or_make_plan(cfg, open_shards(cfg), divisor)  # an object store: staged, then published


@hydra.main(version_base="1.3", config_path="../../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    from omegaconf.errors import MissingMandatoryValue

    from jobs.config import to_typed
    from jobs.generate import EXIT_USAGE

    try:
        plan_typed(to_typed(cfg))
    except MissingMandatoryValue as e:
        log.error("config error: %s is required and has no value; pass %s=... on the command line", e.full_key, e.full_key)
        raise SystemExit(EXIT_USAGE)
    except ValueError as e:  # bad config or data (DatasetError too), found before a unit is written
        log.error("%s", e)
        raise SystemExit(EXIT_USAGE)


if __name__ == "__main__":
    main()
