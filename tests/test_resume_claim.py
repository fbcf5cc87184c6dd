"""Processes sharing one output_dir: concurrent claims, one writer per name pattern, and a resume
scan that never deletes another live writer's shard in progress."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from jobs.resume import RUN_FILE, WriterLock, committed_keys, committed_records, open_run
from sinks import Sample, ShardWriter, SinkConfig

CTX = mp.get_context("fork")  # children only touch files: no torch threads to inherit


def _claim(out, identity, start, results):
    start.wait()
    try:
        open_run(out, identity, overwrite=False)
        results.put((identity["dataset"]["digest"], "ok"))
    except ValueError as e:
        results.put((identity["dataset"]["digest"], str(e)))


def _claim_race(out, identities):
    start, results = CTX.Barrier(len(identities)), CTX.Queue()
    procs = [CTX.Process(target=_claim, args=(out, ident, start, results)) for ident in identities]
    for p in procs:
        p.start()
    got = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    return got


def ident(digest: str) -> dict:
    return {"dataset": {"digest": digest, "records": 3}, "sampling": {"steps": 2}}


@pytest.mark.parametrize("round_", range(3))
def test_identical_runs_started_together_all_claim_one_folder(tmp_path, round_):
    got = _claim_race(tmp_path, [ident("same")] * 4)
    assert [r for _, r in got] == ["ok"] * 4
    assert json.loads((tmp_path / RUN_FILE).read_text()) == ident("same")
    assert not list(tmp_path.glob(".run.json*"))  # no claimer's temp left behind


@pytest.mark.parametrize("round_", range(3))
def test_different_runs_started_together_exactly_one_wins(tmp_path, round_):
    got = _claim_race(tmp_path, [ident("a"), ident("b"), ident("a"), ident("b")])
    winner = json.loads((tmp_path / RUN_FILE).read_text())["dataset"]["digest"]
    for digest, result in got:
        if digest == winner:
            assert result == "ok"
        else:
            assert "different dataset or config" in result and "dataset.digest" in result


def _hold(out, name, ready):
    WriterLock(out, name)
    ready.set()
    signal.pause()


def test_a_second_writer_of_the_same_names_is_refused_until_the_first_dies(tmp_path):
    ready = CTX.Event()
    holder = CTX.Process(target=_hold, args=(tmp_path, "shard-r0003", ready))
    holder.start()
    try:
        assert ready.wait(10)
        with pytest.raises(ValueError, match=rf"pid {holder.pid} .* is writing shard-r0003-\* shards"):
            WriterLock(tmp_path, "shard-r0003")
        WriterLock(tmp_path, "shard-r0004").close()  # another part's names are free
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # the kernel drops a dead holder's lock
        holder.join(10)
    WriterLock(tmp_path, "shard-r0003").close()


def _samples(prefix: str, n: int):
    rng = np.random.default_rng(0)
    return [Sample(f"{prefix}{i}", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for i in range(n)]


def test_resume_scan_removes_its_own_torn_temp_but_not_a_live_writers(tmp_path):
    cfg = SinkConfig(maxcount=2)
    mine = ShardWriter(tmp_path, cfg, "shard-r0000-{index:06d}.tar")
    for s in _samples("a", 3):
        mine.write(s)  # a0,a1 committed; a2 in an open shard: this part's run "died" here
    live = ShardWriter(tmp_path, cfg, "shard-r0001-{index:06d}.tar")
    for s in _samples("b", 3):
        live.write(s)  # b0,b1 committed; b2 being written right now by another rank
    (tmp_path / "_manifest" / "shard-r0001-000000.tar.json").unlink()  # its commit's manifest not yet written
    torn, in_progress = mine._shard.temp_path, live._shard.temp_path

    records = committed_records(tmp_path, "shard-r0000-*.tar")
    assert [r.url for r in records] == ["shard-r0000-000000.tar", "shard-r0001-000000.tar"]
    assert not torn.exists() and in_progress.exists()
    assert not (tmp_path / "_manifest" / "shard-r0001-000000.tar.json").exists()  # read-only on others' files
    live.close()  # the live writer commits its shard unharmed
    assert committed_keys(tmp_path, "shard-r0001-*.tar", within={"a0", "b2", "zz"}) == {"a0", "b2"}
