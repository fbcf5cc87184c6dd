"""benchmarks/detached.sh: a command that outlives the device call (the process group) that started it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "detached.sh")


def _run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, **kw)


def test_a_detached_command_survives_its_callers_group_and_wait_gives_its_status(tmp_path):
    d = tmp_path / "run"
    # The caller is a process group of its own, as a device call is; killing it kills what it left, but for
    # the detached command.
    caller = subprocess.Popen(["bash", "-c", f"bash {SCRIPT} start {d} -- bash -c 'sleep 2; echo \"it ran\"; exit 7'"
                               "; sleep 60"], cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert caller.stdout.readline().startswith("started (pid ")
    os.killpg(caller.pid, signal.SIGKILL)
    caller.wait()
    still = _run("wait", str(d), "0")
    assert still.returncode == 3 and "still running" in still.stdout
    again = _run("start", str(d), "--", "true")  # one at a time in a folder
    assert again.returncode == 2 and "already runs" in again.stderr
    done = _run("wait", str(d), "30")
    assert done.returncode == 7, done.stdout + done.stderr
    assert "it ran" in done.stdout and "ended with status 7" in done.stdout
    assert (d / "rc").read_text().strip() == "7"


def test_wait_without_a_start_and_a_bad_command_line_are_refused(tmp_path):
    p = _run("wait", str(tmp_path / "nothing"), "1")
    assert p.returncode == 2 and "nothing was started" in p.stderr
    p = _run("start", str(tmp_path / "x"), "true")
    assert p.returncode == 2 and "usage" in p.stderr
