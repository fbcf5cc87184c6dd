"""Two staging folders on one bucket (jobs/output/staging_claim.py), on moto's S3 server with s3fs:
a second folder is refused while workers of the first are live, naming both and the fix; workers
sharing one folder (any mount path) join; a killed worker frees the run, at once on its own host
and after its ttl elsewhere; simultaneous starts never admit two folders; a worker frozen past its
ttl and taken over stops committing; and a real job on a second staging folder generates nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from jobs.errors import UserError  # noqa: E402
from jobs.output.layout import STAGING_MARKER_DIR  # noqa: E402
from jobs.output.leases import HOST  # noqa: E402
from jobs.output.staging_claim import StagingClaim, staging_id  # noqa: E402
from jobs.worker.lease import Leaser, LeaseLost  # noqa: E402
from sinks.remote import Remote  # noqa: E402
from tests.helpers import prompts, write_jsonl  # noqa: E402
from tests.s3_server import new_bucket, s3_server  # noqa: E402
from tests.test_storage_s3 import FAST, cli, remote_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def s3():
    with s3_server() as env:
        yield env


def _claim(url: str, folder: Path, ttl_s: float = 600.0) -> StagingClaim:
    return StagingClaim(Remote(url), folder, url, ttl_s)


def _markers(url: str) -> dict:
    return Remote(url).modified(STAGING_MARKER_DIR, "*.json")


JOIN = """
import os, signal, sys
from pathlib import Path
from jobs.output.staging_claim import StagingClaim
from sinks.remote import Remote
url, folder, then = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
try:
    claim = StagingClaim(Remote(url), folder, url, 600.0).join()
except ValueError as e:
    print("REFUSED", e, flush=True)
    sys.exit(3)
print("JOINED", claim.id, flush=True)
if then == "kill":
    os.kill(os.getpid(), signal.SIGKILL)  # no chance to remove its marker
claim.release()
"""


def _join_in_process(url: str, folder: Path, then: str = "release") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", JOIN, url, str(folder), then], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_second_staging_folder_is_refused_while_the_first_is_live(s3, tmp_path):
    url = f"s3://{new_bucket()}/run"
    first = _claim(url, tmp_path / "a").join()
    with pytest.raises(UserError) as e:
        _claim(url, tmp_path / "b").join()
    text = str(e.value)
    assert text.startswith(f"output_dir={url!r} is being generated right now from another staging folder: "
                           f"{tmp_path / 'a'} on host {HOST} (pid {os.getpid()}, heard from ")
    assert f"This job's staging folder is {tmp_path / 'b'} on host {HOST}" in text
    assert "the same job.staging_dir, on a folder they all mount" in text and "+cluster=ray" in text
    assert list(_markers(url)) == [first.name]  # the refused one left nothing behind
    first.release()
    assert _markers(url) == {}
    second = _claim(url, tmp_path / "b").join()  # the first has ended: the second may start at once
    second.release()


def test_workers_sharing_one_staging_folder_join_whatever_their_mount_path(s3, tmp_path):
    url = f"s3://{new_bucket()}/run"
    folder = tmp_path / "shared"
    mine = _claim(url, folder).join()
    (tmp_path / "mount").symlink_to(folder)  # the same folder as another node mounts it
    other = _join_in_process(url, tmp_path / "mount")
    assert other.returncode == 0 and other.stdout.split() == ["JOINED", mine.id], other.stderr[-2000:]
    assert staging_id(tmp_path / "mount") == staging_id(folder) == mine.id
    refused = _join_in_process(url, tmp_path / "elsewhere")
    assert refused.returncode == 3 and f"{folder} on host {HOST}" in refused.stdout
    mine.release()


def test_a_killed_worker_frees_the_run_at_once_on_its_host_and_after_its_ttl_elsewhere(s3, tmp_path):
    url = f"s3://{new_bucket()}/run"
    killed = _join_in_process(url, tmp_path / "a", then="kill")
    assert killed.returncode == -signal.SIGKILL and killed.stdout.startswith("JOINED")
    assert len(_markers(url)) == 1  # left behind
    here = _claim(url, tmp_path / "b").join()  # its process is gone on this host: no wait
    assert list(_markers(url)) == [here.name]  # and its marker was tidied away
    here.release()
    # A worker on another host, heard from just now, with a 2 s ttl (what a marker of another node holds).
    remote = Remote(url)
    remote.put_bytes(f"{STAGING_MARKER_DIR}/{'f' * 16}-node7-4242.json", json.dumps(
        {"staging": "/scratch/stage", "host": "node7", "pid": 4242, "start_time": 1, "ttl_s": 2.0}).encode())
    with pytest.raises(UserError, match="from another staging folder: /scratch/stage on host node7 \\(pid 4242"):
        _claim(url, tmp_path / "b").join()
    time.sleep(3.2)  # its ttl passes without a heartbeat
    late = _claim(url, tmp_path / "b").join()
    assert list(_markers(url)) == [late.name]
    late.release()


def test_simultaneous_starts_never_admit_two_staging_folders(s3, tmp_path):
    url = f"s3://{new_bucket()}/run"
    for round_ in range(4):
        gate = threading.Barrier(4)
        admitted, refused = [], []

        def start(i: int) -> None:
            claim = _claim(url, tmp_path / f"r{round_}-{i}")
            gate.wait()
            try:
                admitted.append(claim.join())
            except UserError as e:
                refused.append(str(e))

        threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(admitted) <= 1 and len(admitted) + len(refused) == 4, refused
        for claim in admitted:
            claim.release()
        assert _markers(url) == {}


def test_a_worker_frozen_past_its_ttl_and_taken_over_stops_committing(s3, tmp_path):
    url = f"s3://{new_bucket()}/run"
    frozen = _claim(url, tmp_path / "a", ttl_s=1.0).join()
    frozen._stop.set()  # its heartbeat stops, as every thread of a SIGSTOPped process does
    frozen._thread.join()
    time.sleep(2.2)  # past its ttl: another folder may take the run over
    successor = _claim(url, tmp_path / "b", ttl_s=600.0).join()
    (tmp_path / "plan").mkdir()
    leaser = Leaser(tmp_path / "plan", "frozen", 1.0, staging=frozen)
    frozen.beat()  # what its heartbeat thread does first when the process is continued
    assert frozen.lost.startswith(f"lost the claim on output_dir={url!r}: this worker was silent for ")
    assert f"another staging folder took the run over meanwhile: {tmp_path / 'b'} on host {HOST}" in frozen.lost
    with pytest.raises(LeaseLost, match="commits nothing more and stops"):
        leaser.check(0)  # the guard before every commit
    successor.release()
    frozen.release()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
def test_a_job_on_a_second_staging_folder_is_refused_and_generates_nothing(s3, tmp_path):
    """The issue's case: two machines, each with its default staging folder, on one bucket."""
    bucket = new_bucket()
    rows = prompts(6)
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    args = [f"dataset.path={data}", f"output_dir=s3://{bucket}/run", *FAST]
    full = dict(os.environ, **s3, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", BCGEN_STAGING_ROOT=str(tmp_path / "m1"),
                BCGEN_TEST_KILL_AT="batch:1", BCGEN_TEST_KILL_SIGNAL="STOP")
    first = subprocess.Popen([sys.executable, "-m", "jobs.generate", *args], cwd=ROOT, env=full,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not _stopped(first.pid):  # frozen mid-run, its marker live
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        before = remote_state(bucket)
        second = cli(args, s3, tmp_path / "m2")
        out = second.stdout + second.stderr
        assert second.returncode == 2 and "Traceback" not in out, out[-3000:]
        assert "is being generated right now from another staging folder: " + str(tmp_path / "m1") in out
        assert f"This job's staging folder is {tmp_path / 'm2'}" in out
        assert remote_state(bucket)["objects"] == before["objects"]  # it uploaded nothing
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=300) == 0, first.stdout.read()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    state = remote_state(bucket)
    assert state["keys"] == Counter({r["key"]: 1 for r in rows})
    assert not any(n.startswith(STAGING_MARKER_DIR) for n in state["objects"])  # it removed its marker
    again = cli(args, s3, tmp_path / "m2")  # the first ended: the other machine may resume (nothing left)
    assert again.returncode == 0 and "nothing to generate" in again.stdout + again.stderr
