"""The start-up clock (jobs/telemetry/startup.py): the wait before the plan, from the kernel's start of the
process. Each case runs in a fresh interpreter: the clock is the process's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the kernel's start time is read in /proc")


def fresh(code: str) -> tuple:
    """What `code` prints (json), run in a new interpreter, and how long the run took seen from here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def test_the_process_age_counts_from_the_kernels_start_of_the_process():
    age, outside = fresh("import json, time; time.sleep(0.6)\n"
                         "from jobs.telemetry.startup import process_age_s; print(json.dumps(process_age_s()))")
    assert 0.6 <= age <= outside + 0.02  # the sleep is in it; the clock tick (10 ms) at most beyond the outside wait


def test_the_parts_run_from_the_process_start_mark_to_mark_in_the_order_they_ended():
    parts, outside = fresh(
        "import json, time\n"
        "from jobs.telemetry import startup\n"
        "time.sleep(0.3); startup.mark('interpreter'); startup.arm()\n"
        "time.sleep(0.2); startup.mark('compose')\n"
        "time.sleep(0.5); startup.mark('compose')\n"  # a second mark of a part does not move it
        "startup.mark('checks')\n"
        "print(json.dumps([startup.seconds(), startup.since_start()]))")
    seconds, since = parts
    assert list(seconds) == ["interpreter", "compose", "checks"]
    assert seconds["interpreter"] >= 0.3 and 0.2 <= seconds["compose"] < 0.5 and seconds["checks"] >= 0.5
    assert sum(seconds.values()) <= since + 0.002 <= outside + 0.022  # each part and `since` rounded to 1 ms


def test_an_unarmed_process_reports_nothing():
    # A notebook's or a test's process started long before any job in it: no start-up of the job's own.
    out, _ = fresh("import json\nfrom jobs.telemetry import startup\nstartup.mark('interpreter')\n"
                   "print(json.dumps([startup.seconds(), startup.since_start()]))")
    assert out == [{}, None]


def test_another_process_times_from_the_first_ones_start_given_as_a_unix_time():
    # A Ray actor times its first batch from its driver's start (jobs/cluster/driver.py actor_factory).
    driver, _ = fresh("import json, time\nfrom jobs.telemetry import startup\ntime.sleep(0.3); startup.arm()\n"
                      "print(json.dumps([startup.started_at(), time.time()]))")
    started_at, then = driver
    assert 0.3 <= then - started_at <= 60
    out, _ = fresh("import json, time\nfrom jobs.telemetry import startup\n"
                   f"startup.arm_at({started_at!r}); since = startup.since_start()\n"
                   f"waited = time.time() - {started_at!r}\n"
                   "print(json.dumps([since, waited, startup.seconds()]))")
    since, waited, parts = out
    assert abs(since - waited) < 0.01 and since >= then - started_at  # the driver's wait, this process's own in it
    assert parts == {}  # no start-up of its own is reported


def test_a_start_given_by_a_clock_far_ahead_gives_no_first_batch_time():
    # Another node's clock ahead of this one's by more than the wait: no negative time is reported.
    out, _ = fresh("import json, time\nfrom jobs.telemetry import startup\nstartup.arm_at(time.time() + 30)\n"
                   "print(json.dumps(startup.since_start()))")
    assert out is None
