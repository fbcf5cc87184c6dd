"""jobs/fast_exit.py: `python -m jobs.generate` leaves without the interpreter's teardown, yet with its exit
status, its atexit handlers run and its output flushed; it exits the orderly way where skipping could lose
work (a live non-daemon thread), a traceback (an exception) or a tool's output (BCGEN_FAST_EXIT=0)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from jobs.fast_exit import exit_after

    out = Path(sys.argv[1])

    class Teardown:  # a module global's __del__ runs in the interpreter's teardown, not before
        def __del__(self):
            sys.__stderr__.write("torn down\\n")

    held = Teardown()
    atexit.register(lambda: (out / "atexit").write_text("ran"))

    def late_write():
        time.sleep(0.5)
        (out / "thread").write_text("done")

    def main():
        sys.stdout.write("unflushed, no newline")
        how = sys.argv[2]
        if how == "thread":
            threading.Thread(target=late_write).start()
        elif how == "raise":
            raise RuntimeError("a bug")
        elif how != "return":
            raise SystemExit(int(how) if how.isdigit() else how)

    exit_after(main)
""")


def run(tmp_path: Path, how: str, **env) -> subprocess.CompletedProcess:
    for name in ("atexit", "thread"):
        (tmp_path / name).unlink(missing_ok=True)
    return subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path), how], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_a_finished_job_leaves_without_teardown_with_its_status_exit_handlers_and_output(tmp_path):
    for how, status in (("return", 0), ("3", 3)):
        p = run(tmp_path, how)
        assert p.returncode == status
        assert p.stdout == "unflushed, no newline"
        assert (tmp_path / "atexit").read_text() == "ran"
        assert "torn down" not in p.stderr  # the teardown was skipped
    p = run(tmp_path, "refused: a message")  # SystemExit's rule: printed, status 1
    assert p.returncode == 1 and p.stderr.startswith("refused: a message")


def test_it_exits_the_orderly_way_where_skipping_could_lose_something(tmp_path):
    p = run(tmp_path, "thread")  # a non-daemon thread still working: waited for, as an orderly exit does
    assert p.returncode == 0 and (tmp_path / "thread").read_text() == "done" and "torn down" in p.stderr
    p = run(tmp_path, "raise")  # not SystemExit: Python's traceback and status
    assert p.returncode == 1 and "RuntimeError: a bug" in p.stderr and "torn down" in p.stderr
    p = run(tmp_path, "return", BCGEN_FAST_EXIT="0")  # tools that act after the module returns
    assert p.returncode == 0 and "torn down" in p.stderr and (tmp_path / "atexit").read_text() == "ran"
