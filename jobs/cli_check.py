"""The command line checked before Hydra's main runs: every config problem as one UserError.

Hydra composes the config inside `@hydra.main`, before any of our code runs, and reports its own
errors (a typo'd key, an unknown preset) with exit 1; it also creates `hydra.run.dir` (under
output_dir) before the task starts, so an output_dir that is a file fails inside Hydra. Composing
the same config here first, with Hydra's compose API and its own argument and sweep parsers,
turns each of these into a message that names the key, the value and the fix, and exit 2. The
config is composed again by Hydra afterwards: composition is cheap and pure.

Only plain runs and sweeps are checked; `--help`, `--cfg`, `--info` and a different config
location are left to Hydra as they are. Only Hydra's public API is used (its compose API, the
override parser of `hydra.core`); the few flags of Hydra's command line are declared here.

A shell leaves `~` after `=` as it is (`output_dir=~/x`), and Hydra's override grammar has no `~`
in a value: `expand_home` expands it as the shell would have, before anything parses the line.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
from pathlib import Path
from typing import List, Sequence

from jobs.errors import UserError

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "generate"
MAX_SWEEP_CHECKED = 256  # a sweep bigger than this is checked on its first jobs only


_HOME_VALUE = re.compile(r"^([+~]{0,2}[A-Za-z_][\w.@/-]*=)(~[^,]*)$")


def expand_home(argv: Sequence[str]) -> List[str]:
    """`key=~/x` -> `key=/home/me/x` (and `key=~`), as a shell expands `~` at the start of a word."""
    out = []
    for arg in argv:
        m = _HOME_VALUE.match(arg)
        out.append(m.group(1) + os.path.expanduser(m.group(2)) if m else arg)
    return out


def _args_parser() -> argparse.ArgumentParser:
    """The flags of Hydra's command line (`python app.py --help` lists them), and the overrides."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--help", "-h"), ("--hydra-help",), ("--version",), ("--resolve",), ("--multirun", "-m"):
        parser.add_argument(*flag, action="store_true")
    for flag in (("--cfg", "-c"), ("--package", "-p"), ("--info", "-i"), ("--shell-completion", "-sc"),
                 ("--config-path", "-cp"), ("--config-name", "-cn"), ("--config-dir", "-cd"),
                 ("--experimental-rerun",)):
        parser.add_argument(*flag, nargs="?", const=True, default=None)
    parser.add_argument("overrides", nargs="*")
    return parser


def check_command_line(argv: Sequence[str]) -> List[Path]:
    """Raise UserError for the first problem in the config these arguments compose; return the
    local output folder of each job checked (none for `--help` and the like)."""
    args, unknown = _args_parser().parse_known_args(list(argv))
    if unknown:
        return []  # a flag this check does not know: Hydra's own parser reports it
    if (args.help or args.hydra_help or args.version or args.cfg or args.info or args.shell_completion
            or args.experimental_rerun or args.config_path or args.config_name or args.config_dir):
        return []
    _check_hydra_overrides(args.overrides)
    runs = _runs(args.overrides, args.multirun)[:MAX_SWEEP_CHECKED]
    for overrides in runs:
        _check_ray_section(overrides)
    folders = [_check_one(overrides, args.multirun) for overrides in runs]
    _check_one_folder_a_job(runs, folders)
    return folders


# Keys whose values are workers of one run: a sweep over them shares one folder by design (`-m
# hydra/launcher=submitit_local job.partition=0/2,1/2`: array tasks that split one run's units).
WORKER_KEYS = ("job.partition", "device")


def _check_one_folder_a_job(runs: List[List[str]], folders: List[Path]) -> None:
    """Two jobs of a sweep in one output folder: the second is refused as another run (a swept dataset.path),
    or resumes the first and skips its work (bcg=on,off: the off job ran nothing, exit 0). Keys that say where
    or how to run stay out of a folder's name (conf/generate.yaml), and an output_dir= given with -m is one
    folder for all: both are refused before anything runs, unless the jobs differ only in WORKER_KEYS."""
    first: dict = {}
    for overrides, folder in zip(runs, folders):
        other = first.setdefault(folder.resolve(), overrides)
        differ = [o for o in overrides if o not in other]
        if other is not overrides and any(o.split("=", 1)[0].lstrip("+~") not in WORKER_KEYS for o in differ):
            differ = [o for o in differ if o.split("=", 1)[0].lstrip("+~") not in WORKER_KEYS]
            raise UserError(f"command line: two jobs of the sweep write to one folder, {folder} (the second sets "
                            f"{', '.join(differ)}): a run's folder is named by its overrides, leaving out those that "
                            f"say where or how to run. Sweep a key that names the folder, run the jobs one by one "
                            f"with an output_dir= each, or drop output_dir= from a sweep")


# Hydra keys that choose where Hydra writes, or what code it calls: a typo or a copied command line
# could write logs anywhere (hydra.run.dir=/etc), or run any callable (+hydra.callbacks.x._target_=os.system).
HYDRA_PATH_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.output_subdir", "hydra.callbacks",
                   "hydra.searchpath", "hydra.job_logging", "hydra.hydra_logging", "hydra.job.chdir",
                   "hydra.runtime", "hydra/job_logging", "hydra/hydra_logging", "hydra/callbacks")
ALLOW_HYDRA_ENV = "BCGEN_ALLOW_HYDRA_PATHS"


def _check_hydra_overrides(overrides: Sequence[str]) -> None:
    """Refuse hydra.* overrides that write or call elsewhere, unless BCGEN_ALLOW_HYDRA_PATHS=1."""
    if os.environ.get(ALLOW_HYDRA_ENV) == "1":
        return
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if any(key == k or key.startswith(k + ".") or key.startswith(k + "/") for k in HYDRA_PATH_KEYS):
            raise UserError(f"command line: {text!r} changes where Hydra writes or what it calls; bcgen keeps Hydra's "
                            f"logs in output_dir/logs/ (conf/generate.yaml). Leave it out, or set "
                            f"{ALLOW_HYDRA_ENV}=1 to allow it (then it writes where you say)")


def _check_ray_section(overrides: List[str]) -> None:
    """`ray.*` keys exist only under +cluster=ray (the section is null otherwise), and Hydra's own
    error for setting a key under null is an AssertionError that names neither."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    if "cluster" in keys:  # conf/cluster/ray.yaml, or a preset of the user's that may add the section
        return
    ray_keys = [o for o, k in zip(overrides, keys) if k == "ray" or k.startswith("ray.")]
    if ray_keys:
        raise UserError(f"command line: {ray_keys[0]!r} sets the Ray section, which only +cluster=ray adds: "
                        f"python -m jobs.generate +cluster=ray {' '.join(ray_keys)} ...")


def _runs(overrides: List[str], multirun: bool) -> List[List[str]]:
    """The override list of each job the command starts (one, or one per sweep point), expanded as
    Hydra's basic sweeper does: the product of every swept key's values, in command-line order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        message = _brace_hint(overrides) or (f"command line: {_first_line(e)}; write overrides as key=value, and "
                                             f"quote a value that holds a quote, '=' or spaces for Hydra inside the "
                                             f"shell's quotes: 'sampling.negative_prompt=\"don\'t, blur\"'")
        raise UserError(message) from None
    _check_brace_lists(parsed)
    if not multirun:
        sweeps = [str(o.input_line) for o in parsed if o.is_sweep_override()]
        if sweeps:
            key, _, value = sweeps[0].partition("=")
            raise UserError(f"command line: {sweeps[0]!r} sweeps over several values; add -m (--multirun) to run "
                            f"one job per value, or give one value. If the commas are part of one value (a prompt), "
                            f"quote it for Hydra inside the shell's quotes: '{key}=\"{value}\"'")
        return [list(overrides)]
    choices = {}  # key -> its `key=value` strings; a key given twice keeps its last (as the sweeper does)
    for o in parsed:
        key = o.get_key_element()
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            try:
                choices[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            except HydraException:
                return []  # glob(): its options need Hydra's config loader; Hydra expands and checks it
        else:
            return []  # range/interval sweeps of other sweepers (Optuna, Ax): theirs to expand
    return [list(job) for job in itertools.product(*choices.values())]


# Hydra keeps the last of a key given twice, which scripts use (defaults, then the user's own). A brace list the
# shell expanded is another thing: its arguments come in a row, and for dataset.path it silently drops files.
BRACE_LIST_KEYS = ("dataset.path",)  # given twice anywhere: refused
BRACE_RUN = 3  # any key given this many times in a row: refused


def _check_brace_lists(parsed) -> None:
    """Refuse what an unquoted brace list becomes: dataset.path=p-{000..099}.jsonl reaches Hydra as 100 arguments,
    and the job read p-099.jsonl alone (1% of the dataset, exit 0). dataset.path given twice anywhere, or any key
    given BRACE_RUN times in a row, names the arguments and the quoting. (~key, a deletion, does not count.)"""
    from hydra.core.override_parser.types import OverrideType

    sets = [(o.get_key_element(), o.input_line) for o in parsed if o.type != OverrideType.DEL]
    given: dict = {}
    for key, line in sets:
        given.setdefault(key, []).append(line)
    twice = [key for key in BRACE_LIST_KEYS if len(given.get(key, [])) > 1]
    run_start = 0
    for i in range(1, len(sets) + 1):
        if i == len(sets) or sets[i][0] != sets[run_start][0]:
            if i - run_start >= BRACE_RUN:
                twice.append(sets[run_start][0])
            run_start = i
    if not twice:
        return
    key = twice[0]
    lines = given[key]
    shown = ", ".join(repr(line) for line in lines[:3]) + (f" and {len(lines) - 3} more" if len(lines) > 3 else "")
    raise UserError(f"command line: {key} is given {len(lines)} times ({shown}); Hydra would keep only the last. "
                    f"An unquoted brace list is expanded by the shell into one argument a file: quote it for the shell "
                    f"and for Hydra, '{key}=\"prompts-{{000..099}}.jsonl\"'; otherwise give {key} once")


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


def _check_one(overrides: List[str], multirun: bool) -> Path:
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
    local = resolve(typed.output_dir, typed.job.staging_dir).local  # an object store: its staging folder
    check_writable(local)
    _check_no_file_above(Path(log_dir), "hydra.sweep.dir" if multirun else "hydra.run.dir (Hydra's log folder)")
    return local


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
