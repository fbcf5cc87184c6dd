"""The README's snippets, run: its first commands for real, every other command line checked, every
Python block executed against a real output from another directory.

- The first block (install, generate, inspect) runs as written, in a fresh folder, with one change
  for CI's clock: `dataset.limit=16` becomes 2 (the README's timing is measured on a fresh machine,
  not here). The inspect line must name the folder the generate line wrote.
- Every other `python -m jobs.*` / `torchrun` line is checked the way the command itself starts
  (jobs/cli_check.py: Hydra's compose of the real config, every value typed and checked, output_dir
  writable), its placeholders (`/ckpt/...`, `...`, `<partition>`) replaced by real paths.
  `jobs.inspect` lines run for real on the output the first block made.
- Every ```python block runs with `/data/synth` as that output, from another working directory
  (the wids snippet once failed there).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli_check import check_command_line, expand_home
from tests.helpers import prompts, write_jsonl

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FAST_LIMIT = 2  # the first command's dataset.limit here (the README says 16)


def blocks(lang: str) -> list:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def command_lines(block: str) -> list:
    """Each command of a bash block: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.split(r"\s{2,}#|^#", line)[0].strip()
        if line:
            out.append(line)
    return out


def job_commands() -> list:
    return [c for b in blocks("bash") for c in command_lines(b) if c.startswith(("python -m jobs.", "torchrun "))]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The README's first block, run in a fresh folder (the package is installed in this venv)."""
    tmp = tmp_path_factory.mktemp("readme")
    first = command_lines(blocks("bash")[0])
    assert first[0].startswith("pip install -e .")
    generate, inspect = first[1], first[2]
    assert generate == "python -m jobs.generate dataset.limit=16"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    outputs = {}
    for cmd in (generate, inspect):
        cmd = cmd.replace("dataset.limit=16", f"dataset.limit={FAST_LIMIT}").replace("limit:16", f"limit:{FAST_LIMIT}")
        proc = subprocess.run([sys.executable, *shlex.split(cmd)[1:], *(["job.progress=false"] if "generate" in cmd
                                                                          else [])],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
        outputs[cmd] = proc
    out = tmp / "outputs" / f"sana_tiny--dataset.limit:{FAST_LIMIT}"
    return tmp, out


def test_the_first_commands_write_where_the_next_one_looks(first_run):
    tmp, out = first_run
    assert sorted(p.name for p in (tmp / "outputs").iterdir()) == [out.name]
    assert (out / "index.wids.json").is_file() and len(list(out.glob("shard-*.tar"))) == 1
    assert (out / "_inspect" / "contact_sheet.png").is_file() and (out / "_inspect" / "throughput.png").is_file()


def _placeholders(cmd: str, tmp: Path, out: Path) -> str:
    data = write_jsonl(tmp / "prompts.jsonl", prompts(3))
    (tmp / "p.csv").write_text("prompt\na red star\n")
    cmd = re.sub(r"(?<![\w/])outputs/sana_tiny\S*", str(out), cmd).replace("/data/synth", str(out))
    cmd = cmd.replace("/data/run_a", str(out)).replace("/data/run_b", str(out))  # --against: itself, identical
    cmd = re.sub(r"model\.path=/ckpt/\S+|model\.path=\.\.\.", f"model.path={tmp / 'ckpt'}", cmd)
    cmd = cmd.replace("dataset.path=...", f"dataset.path={data}").replace("dataset.path=prompts.jsonl",
                                                                          f"dataset.path={data}")
    return cmd.replace("dataset.path=p.csv", f"dataset.path={tmp / 'p.csv'}").replace("<partition>", "gpu")


def test_every_job_command_line_is_accepted(first_run, tmp_path):
    from jobs.inspect import main as inspect_main

    _, out = first_run
    commands = job_commands()
    assert len(commands) >= 15, commands  # the snippets are found (a changed fence would hide them all)
    checked = 0
    for cmd in commands[2:]:  # the first block's two ran for real
        args = shlex.split(_placeholders(cmd, tmp_path, out))
        if args[0] == "torchrun":
            args = ["python", "-m", *args[args.index("-m") + 1:]]
        module, rest = args[2], args[3:]
        if module == "jobs.inspect":
            assert inspect_main(rest + ["--out", str(tmp_path / f"look{checked}")]) == 0, cmd
        elif module == "jobs.verify":
            from jobs.verify import main as verify_main

            assert verify_main(rest) == 0, cmd
        else:
            assert module in ("jobs.generate", "jobs.plan"), cmd
            rest = [a for a in rest if a != "--estimate"]
            cwd = os.getcwd()
            os.chdir(tmp_path)  # relative output folders land here, not in the checkout
            try:
                check_command_line(expand_home(rest))
            finally:
                os.chdir(cwd)
        checked += 1
    assert checked >= 13


def test_every_python_snippet_runs_from_another_folder(first_run, tmp_path, monkeypatch):
    _, out = first_run
    monkeypatch.chdir(tmp_path)  # not the output folder: relative shard urls must still resolve
    snippets = blocks("python")
    assert len(snippets) >= 2
    items = FAST_LIMIT  # what the first command wrote
    for code in snippets:
        ns: dict = {}
        exec(compile(code.replace("/data/synth", str(out)), "README.md", "exec"), ns)  # noqa: S102
        if "df" in ns:
            assert len(ns["df"]) == items
        if "samples" in ns:
            assert len(ns["samples"]) == items and ns["samples"][0][".json"]
