"""The command line a new user types: where runs land, `~` in paths, what `--help` lists.

Real Hydra composes (the compose API, with Hydra's own config set as `@hydra.main` sets it) and
the real CLI in a subprocess where what is checked is what a terminal shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli_check import _runs, check_command_line, expand_home
from jobs.errors import UserError
from tests.helpers import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]


def composed(overrides):
    """(output_dir, hydra.run.dir) of one job, resolved as Hydra resolves them inside @hydra.main."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from jobs.config import register_configs, to_typed

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("generate", overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        run_dir = str(cfg.hydra.run.dir)
        with open_dict(cfg):
            del cfg["hydra"]
        return to_typed(cfg).output_dir, run_dir


def test_sweep_jobs_land_beside_the_plain_run_never_inside_it():
    plain, _ = composed([])
    jobs = [composed(o)[0] for o in _runs(["sampling.steps=1,2", "sampling.guidance_scale=3"], multirun=True)]
    assert plain == "outputs/sana_tiny"
    assert jobs == ["outputs/sana_tiny--sampling.guidance_scale:3--sampling.steps:1",
                    "outputs/sana_tiny--sampling.guidance_scale:3--sampling.steps:2"]
    for folder in [plain, *jobs]:
        others = [Path(f) for f in [plain, *jobs] if f != folder]
        assert all(Path(folder) not in o.parents for o in others), (folder, others)
    # where-to-run keys stay out of the name: the same run, resumed with another partition, is one folder
    assert composed(["job.partition=0/1", "device=cpu"])[0] == plain


def test_a_slash_in_a_swept_value_does_not_open_a_subfolder():
    out, _ = composed(["sampling.negative_prompt=a/b"])
    assert out == "outputs/sana_tiny--sampling.negative_prompt:a_b"


def test_a_model_name_or_a_long_value_keeps_the_folder_one_plain_name_under_outputs():
    """model.name=../x climbed out of outputs/ and a/b nested in a run's folder; a 280-byte negative prompt made
    a folder name longer than the file system allows (a traceback)."""
    assert composed(["model.name=../escaped"])[0] == "outputs/.._escaped--model.name:.._escaped"
    assert composed(["model.name=sana_tiny/x"])[0] == "outputs/sana_tiny_x--model.name:sana_tiny_x"
    from jobs.output.layout import run_folder_name

    assert run_folder_name("..", "") == "_.." and run_folder_name("a/b", "") == "a_b"  # a preset's own name
    long = composed(["sampling.negative_prompt=" + "blurry_" * 40])[0]
    other = composed(["sampling.negative_prompt=" + "blurry_" * 41])[0]
    assert long != other and long == composed(["sampling.negative_prompt=" + "blurry_" * 40])[0]
    for folder in (long, other):
        name = Path(folder).name
        assert Path(folder).parent == Path("outputs") and len(name.encode()) <= 200, folder
        assert name.startswith("sana_tiny--sampling.negative_prompt:blurry_blurry_")


def test_a_key_given_twice_is_refused_naming_both():
    """The shell expands an unquoted brace list, dataset.path=p-{000..001}.jsonl, into two arguments; Hydra kept
    the last and the job read one file of the two, exit 0. Other keys keep Hydra's last-wins (a script's defaults,
    then the user's), but for a run of three in a row."""
    with pytest.raises(UserError, match=r"dataset.path is given 2 times \('dataset.path=p-000.jsonl', "
                                        r"'dataset.path=p-001.jsonl'\); Hydra would keep only the last"):
        check_command_line(["dataset.path=p-000.jsonl", "dataset.path=p-001.jsonl"])
    with pytest.raises(UserError, match="model.loras is given 3 times"):  # a brace list of another key: 3 in a row
        check_command_line(["model.loras=[a1]", "model.loras=[a2]", "model.loras=[a3]"])
    # A script's default, then the user's own value, is Hydra's last-wins, and stays so.
    assert _runs(["sampling.steps=1", "sampling.guidance_scale=3", "sampling.steps=3"], multirun=False)
    assert _runs(["~sampling.steps", "sampling.steps=3"], multirun=False)  # delete, then set: Hydra's own idiom


def test_two_jobs_of_a_sweep_in_one_folder_are_refused_before_anything_runs():
    """bcg=on,off put both jobs in one folder (bcg stays out of its name): the off job resumed the on job's run and
    generated nothing, exit 0. A swept dataset.path, or an output_dir= given with -m, did the same."""
    with pytest.raises(UserError, match=r"two jobs of the sweep write to one folder, outputs/sana_tiny "
                                        r"\(the second sets bcg=off\)"):
        check_command_line(["-m", "bcg=on,off"])
    with pytest.raises(UserError, match="the second sets sampling.steps=2"):
        check_command_line(["-m", "sampling.steps=1,2", "output_dir=/tmp/one-folder"])
    assert len(check_command_line(["-m", "sampling.steps=1,2"])) == 2  # a key that names the folder


def test_a_run_folder_can_be_passed_back_as_output_dir():
    out, _ = composed(["sampling.steps=2", "sampling.guidance_scale=3"])
    assert composed([f"output_dir={out}"])[0] == out  # no `=` or `,` for Hydra's grammar to trip on


def test_sweep_expansion_is_the_product_in_command_line_order():
    assert _runs(["a=1,2", "b=x", "c=range(0,2)"], multirun=True) == [
        ["a=1", "b=x", "c=0"], ["a=1", "b=x", "c=1"], ["a=2", "b=x", "c=0"], ["a=2", "b=x", "c=1"]]
    with pytest.raises(UserError, match="add -m"):
        _runs(["sampling.steps=1,2"], multirun=False)
    # A prompt's commas and apostrophes: the advice quotes it, and the quoted form is one value.
    with pytest.raises(UserError, match="""quote it for Hydra inside the shell's quotes: 'sampling.negative_prompt="""
                                        """"blurry, low quality"'"""):
        _runs(["sampling.negative_prompt=blurry, low quality"], multirun=False)
    with pytest.raises(UserError, match="quote a value that holds a quote"):
        _runs(["sampling.negative_prompt=don't"], multirun=False)
    assert _runs(['sampling.negative_prompt="don\'t, blur"'], multirun=False)


def test_a_swept_typo_is_refused_before_hydra_runs():
    with pytest.raises(UserError, match="stpes"):
        check_command_line(["-m", "sampling.stpes=1,2"])


def test_home_is_expanded_unquoted_and_quoted(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = expand_home(["output_dir=~/x", "dataset.path=~", "sampling.negative_prompt=a~b", "+x=~/y"])
    assert argv == [f"output_dir={tmp_path}/x", f"dataset.path={tmp_path}", "sampling.negative_prompt=a~b",
                    f"+x={tmp_path}/y"]
    check_command_line(expand_home(["output_dir=~/x"]))  # no lexer error any more
    out, run_dir = composed(["output_dir='~/quoted'", "job.staging_dir='~/stage'"])
    assert out == f"{tmp_path}/quoted"
    assert run_dir.startswith(f"{tmp_path}/quoted/logs/")  # Hydra's log folder too: no folder named `~`
    from tests.helpers import compose_cfg

    cfg = compose_cfg(["dataset.path='~/p.jsonl'", "model.path='~/ckpt'", "job.tensorboard='~/tb'"])
    assert (cfg.dataset.path, cfg.model.path, cfg.job.tensorboard) == (
        f"{tmp_path}/p.jsonl", f"{tmp_path}/ckpt", f"{tmp_path}/tb")
    assert compose_cfg(["output_dir='s3://b/~x'"]).output_dir == "s3://b/~x"  # a URL is not a path


def _cli(*args, module="jobs.generate"):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_help_and_unknown_preset_list_presets_not_schemas():
    help_text = _cli("--help").stdout
    assert "model: flux, flux_tiny," in help_text and "sana_tiny" in help_text
    assert "schema" not in help_text.split("== Config ==")[0]
    bad = _cli("model=nope")
    assert bad.returncode == 2
    assert "available options in 'model'" in bad.stderr and "sana_tiny" in bad.stderr
    assert "schema" not in bad.stderr


def test_a_bad_dataset_leaves_nothing_in_output_dir(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    for out in (fresh, existing):
        proc = _cli(f"dataset.path={bad}", f"output_dir={out}")
        assert proc.returncode == 2 and "bad.jsonl:1: prompt must be a string" in proc.stderr + proc.stdout
    assert not fresh.exists()  # no logs/, no _locks/, not the folder either
    assert existing.is_dir() and not any(existing.iterdir())  # the user's folder stays, empty as it was
    planned = _cli(f"dataset.path={bad}", f"output_dir={fresh}", module="jobs.plan")
    assert planned.returncode == 2 and "bad.jsonl:1" in planned.stderr + planned.stdout
    assert not fresh.exists()  # the planner's front door leaves nothing either


def test_a_refused_job_leaves_a_claimed_run_alone(tmp_path):
    from jobs.output.claim import remove_unclaimed

    out = tmp_path / "out"
    log_dir = out / "logs" / "2026-rank0"
    log_dir.mkdir(parents=True)
    (out / "_locks").mkdir()
    (out / "_locks" / "plan.lock").write_text("")
    (out / "run.json").write_text("{}")
    remove_unclaimed(out, log_dir, existed=False)
    assert log_dir.exists()  # the run's log of this job's error stays
    assert (out / "_locks" / "plan.lock").exists() and (out / "run.json").exists()
    (out / "run.json").unlink()
    (out / "stray.txt").write_text("not ours")
    remove_unclaimed(out, log_dir, existed=False)
    assert not log_dir.exists()  # unclaimed: this job's own log folder goes
    assert (out / "stray.txt").exists() and (out / "_locks" / "plan.lock").exists()  # not ours: stays


def test_dir_lock_excludes_another_process(tmp_path):
    import multiprocessing as mp

    from jobs.output.claim import dir_lock

    def try_lock(path, q):
        from filelock import FileLock, Timeout

        try:
            with FileLock(path, timeout=0.2):
                q.put("got it")
        except Timeout:
            q.put("busy")

    q = mp.get_context("fork").Queue()
    with dir_lock(tmp_path, "plan"):
        p = mp.get_context("fork").Process(target=try_lock, args=(str(tmp_path / "_locks" / "plan.lock"), q))
        p.start()
        p.join(10)
        assert q.get(timeout=5) == "busy"
    p = mp.get_context("fork").Process(target=try_lock, args=(str(tmp_path / "_locks" / "plan.lock"), q))
    p.start()
    p.join(10)
    assert q.get(timeout=5) == "got it"


def test_a_run_inside_or_around_another_runs_folder_is_refused(tmp_path):
    """A run in OTHER/sub (or one around OTHER) made a reader of the outer folder read both runs' samples as one
    dataset (pyarrow's folder discovery: 12 rows of 8 + 4, duplicates and all)."""
    from jobs.output.claim import check_writable

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    with pytest.raises(UserError, match=r"is inside the folder of the run in .*run: a reader of that folder would "
                                        r"read both runs as one"):
        check_writable(run / "sub")
    with pytest.raises(UserError, match=r"holds the run in .*run: a reader of output_dir would read both runs"):
        check_writable(tmp_path)
    check_writable(run)  # its own folder: a resume
    check_writable(tmp_path / "beside")


def test_a_run_that_committed_nothing_is_refused_saying_that_starting_over_loses_nothing(tmp_path):
    """A job that failed before its first shard (a bad model.path, fixed since) left a claim; the refusal of the
    corrected rerun offered to 'delete its shards', of which there were none."""
    from jobs.output.claim import open_run

    open_run(tmp_path, {"model": {"path": "/ckpt/broken"}}, overwrite=False)
    with pytest.raises(UserError, match="job.overwrite=true to start over: it holds no committed shard, so nothing is "
                                        "lost"):
        open_run(tmp_path, {"model": {"path": "/ckpt/fixed"}}, overwrite=False)
    (tmp_path / "shard-u0000000-0000.tar").write_bytes(b"")
    with pytest.raises(UserError, match="job.overwrite=true to delete its shards and start over"):
        open_run(tmp_path, {"model": {"path": "/ckpt/fixed"}}, overwrite=False)


def test_a_sweep_over_where_one_runs_workers_run_shares_its_folder():
    """`-m hydra/launcher=submitit_local job.partition=0/2,1/2`: array tasks of one run, one folder by design."""
    folders = check_command_line(["-m", "job.partition=0/2,1/2"])
    assert len(folders) == 2 and folders[0] == folders[1]
    with pytest.raises(UserError, match=r"the second sets sampling.steps=2\)"):
        check_command_line(["-m", "job.partition=0/2,1/2", "sampling.steps=1,2", "output_dir=/tmp/one-folder"])
