"""`python -m jobs.plan [--estimate] [overrides]`: plan a run without generating (the same config as jobs.generate).

Streams the dataset once and writes `output_dir/_plan/` (work units + plan.json), claiming
output_dir for the run; then start any number of `jobs.generate` workers on the same config,
at any time, with torchrun, Slurm/submitit or by hand. `--estimate` also prints how long the
items left take, from the plan's costs and a measured rate (jobs/plan/estimate.py). Exit 2 on
bad config or data.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from jobs.config import GenerateConfig, register_configs, to_typed
from jobs.errors import EXIT_USAGE, UserError
from jobs.refused import leave_nothing, note_existing

log = logging.getLogger("jobs.plan")

register_configs()

ESTIMATE_FLAG = "--estimate"


def plan_typed(cfg: GenerateConfig, estimate: bool = False) -> None:
    # Imported here, not at the top: `--help` and Hydra's own errors should not wait for the
    # planner's imports (pyarrow, the families and their diffusers classes).
    from jobs.output.mirror import open_shards
    from jobs.plan.publish import join_or_make_plan
    from jobs.preflight import check_config

    checked = check_config(cfg, loads_weights=False)  # a plan reads no weights
    shards = open_shards(cfg.output_dir, cfg.job.staging_dir, keep_fields=cfg.dataset.keep_fields)
    manifest = join_or_make_plan(cfg, shards, checked.divisor)  # an object store: staged, then published
    if estimate:
        for line in estimate_lines(cfg, manifest, checked.output_dir):
            log.info(line)


def estimate_lines(cfg: GenerateConfig, manifest, output_dir) -> list:
    """The estimate of the plan's items left, with the best rate there is: measured in this
    output_dir, else cached for this model and tier on this device, else on another device."""
    # Imported here for the start-up cost, as plan_typed's imports.
    from jobs.models.registry import get_family
    from jobs.output.done import done_units
    from jobs.output.layout import PLAN_DIR
    from jobs.plan.estimate import cost_of, estimate
    from jobs.provenance import quality_tier
    from jobs.telemetry.rates import cached_rates, measured_rate, rate_model

    tier = quality_tier(cfg.bcg.fusions, cfg.bcg.compile)
    model = rate_model(cfg.model.name, get_family(cfg.model.family).component_config(cfg.model, "transformer"))
    cached = cached_rates(model, tier)
    rate = measured_rate(output_dir, cost_of(manifest))
    if rate is None and cached:
        here = this_device(cfg.device)
        rate = next((r for r in cached if r.device == here), None) or cached[0]
    return estimate(manifest, done_units(output_dir / PLAN_DIR), rate).lines()


def this_device(device: str) -> str:
    """The name rates are cached under for this machine's device: its GPU's, or "cpu". Only
    torch knows it, so `--estimate` imports torch, and only where a cached rate is the best it has."""
    if device == "cpu":
        return "cpu"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def cli() -> None:
    from jobs.cli_check import check_command_line, expand_home

    argv = expand_home(sys.argv[1:])
    estimate = ESTIMATE_FLAG in argv
    sys.argv[1:] = [a for a in argv if a != ESTIMATE_FLAG]  # Hydra's main reads sys.argv; the flag is ours
    try:
        note_existing(check_command_line(sys.argv[1:]))
    except UserError as e:
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("%s", e)
        raise SystemExit(EXIT_USAGE) from None

    @hydra.main(version_base="1.3", config_path="../../conf", config_name="generate")
    def main(cfg: DictConfig) -> None:
        # As jobs.generate: only a UserError (bad config, data or environment) is one message and exit 2;
        # anything else is a crash and keeps its traceback.
        typed = None
        try:
            typed = to_typed(cfg)
            plan_typed(typed, estimate)
        except UserError as e:
            log.error("%s", e)
            if typed is not None:
                leave_nothing(typed)  # a refused plan leaves nothing in an unclaimed output_dir
            raise SystemExit(EXIT_USAGE) from None

    main()


if __name__ == "__main__":
    cli()
