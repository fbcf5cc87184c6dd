"""The command line checked before Hydra's main runs: every config problem as one UserError.

Hydra composes the config inside `@hydra.main`, before any of our code runs, and reports its own
errors (a typo'd key, an unknown preset) with exit 1; it also creates `hydra.run.dir` (under
output_dir) before the task starts, so an output_dir that is a file fails inside Hydra. Composing
the same config here first, with Hydra's compose API and its own argument and sweep parsers,
turns each of these into a message that names the key, the value and the fix, and exit 2. The
config is composed again by Hydra afterwards: composition is cheap and pure.

Only plain runs and sweeps are checked; `--help`, `--cfg`, `--info` and a different config
location are left to Hydra as they are.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Sequence

from jobs.errors import UserError

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "generate"
MAX_SWEEP_CHECKED = 256  # a sweep bigger than this is checked on its first jobs only


def check_command_line(argv: Sequence[str]) -> None:
    """Raise UserError for the first problem in the config these arguments compose."""
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return  # argparse already printed its usage error; Hydra prints it again and exits
    if (args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.experimental_rerun
            or args.config_path or args.config_name or args.config_dir):
        return
    _check_hydra_overrides(args.overrides)
    for overrides in _runs(args.overrides, args.multirun)[:MAX_SWEEP_CHECKED]:
        _check_one(overrides, args.multirun)


# Hydra keys that choose where Hydra writes, or what code it calls: a typo or a copied command line
# could write logs anywhere (hydra.run.dir=/etc), or run any callable (+hydra.callbacks.x._target_=os.system).
HYDRA_PATH_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.output_subdir", "hydra.callbacks",
                   "hydra.searchpath", "hydra.job_logging", "hydra.hydra_logging", "hydra.job.chdir",
                   "hydra.runtime", "hydra/job_logging", "hydra/hydra_logging", "hydra/callbacks")
ALLOW_HYDRA_ENV = "BCGEN_ALLOW_HYDRA_PATHS"


def _check_hydra_overrides(overrides: Sequence[str]) -> None:
    """Refuse hydra.* overrides that write or call elsewhere, unless BCGEN_ALLOW_HYDRA_PATHS=1."""
    import os

    if os.environ.get(ALLOW_HYDRA_ENV) == "1":
        return
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if any(key == k or key.startswith(k + ".") or key.startswith(k + "/") for k in HYDRA_PATH_KEYS):
            raise UserError(f"command line: {text!r} changes where Hydra writes or what it calls; bcgen keeps Hydra's "
                            f"logs in output_dir/logs/ (conf/generate.yaml). Leave it out, or set "
                            f"{ALLOW_HYDRA_ENV}=1 to allow it (then it writes where you say)")


def _runs(overrides: List[str], multirun: bool) -> List[List[str]]:
    """The override list of each job the command starts (one, or one per sweep point)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        message = _brace_hint(overrides) or f"command line: {_first_line(e)}; write overrides as key=value"
        raise UserError(message) from None
    if not multirun:
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        if sweeps:
            raise UserError(f"command line: {sweeps[0]!r} sweeps over several values; add -m (--multirun) to run "
                            f"one job per value, or give one value")
        return [list(overrides)]
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(job) for batch in batches for job in batch]


def _brace_hint(overrides: Sequence[str]) -> str:
    """The message for an unquoted `{` in a value: Hydra's grammar reads it as the start of a
    dictionary, so a brace list (`dataset.path=prompts-{000..099}.jsonl`) fails to parse with a
    message about `{` alone. Empty unless an override that fails to parse holds an unquoted brace
    (a valid dict override, `model.tiny.vae={...}`, is not one)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides:
        key, eq, value = text.partition("=")
        if not eq or "{" not in value or value.startswith(("'", '"')):
            continue
        try:
            parser.parse_override(text)
        except HydraException:
            return (f"command line: {text!r}: Hydra reads an unquoted '{{' as the start of a dictionary. Quote the "
                    f"value for Hydra, inside quotes for the shell: '{key}=\"{value}\"' (a brace list such as "
                    f"dataset.path=\"prompts-{{000..099}}.jsonl\" names every file of the range)")
    return ""


def _check_one(overrides: List[str], multirun: bool) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from jobs.config import register_configs, to_typed
    from jobs.output.claim import check_writable
    from jobs.output.storage import resolve

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(CONFIG_NAME, overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)  # `${hydra:...}` in output_dir resolves against it
            log_dir = cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir
            with open_dict(cfg):
                del cfg["hydra"]
            typed = to_typed(cfg)
    except MissingConfigException as e:
        raise UserError(f"config: {_missing_config(e)}") from None
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(f"config: {_composition_message(e)}") from None
    check_writable(resolve(typed.output_dir, typed.job.staging_dir).local)  # an object store: its staging folder
    _check_no_file_above(Path(log_dir), "hydra.sweep.dir" if multirun else "hydra.run.dir (Hydra's log folder)")


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _missing_config(e: BaseException) -> str:
    # Hydra's message lists the available options on the following lines: keep them, drop the search path.
    text = str(e).split("Config search path:")[0].strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip()).replace(
        "Available options in", "; available options in")


def _composition_message(e: BaseException) -> str:
    head = _first_line(e)
    cause = e.__cause__
    if cause is not None:
        # Hydra suggests `+key=value` for an unknown key; the schema refuses added keys, so say what exists.
        head = head.rstrip(".")
        detail = _first_line(cause)
        head = f"{head}: {detail}"
        known = _known_keys_of(cause)
        if known:
            head += f"; known keys there: {known}"
    return head


def _known_keys_of(cause: BaseException) -> str:
    import dataclasses

    object_type = getattr(cause, "object_type", None)
    if object_type is not None and dataclasses.is_dataclass(object_type) and "not in" in str(cause):
        return ", ".join(sorted(f.name for f in dataclasses.fields(object_type)))
    return ""


def _check_no_file_above(path: Path, key: str) -> None:
    """Hydra creates this folder before our task starts: a file in its way fails inside Hydra."""
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{key}={str(path)!r} cannot be created: {str(parent)!r} is a file, not a "
                                f"directory; choose another output_dir (or move the file)")
            return
