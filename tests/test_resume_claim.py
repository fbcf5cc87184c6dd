"""Processes sharing one output_dir: concurrent claims, one writer per name pattern, and a resume
scan that never deletes another live writer's shard in progress."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from jobs.output.layout import RUN_FILE
from jobs.output.claim import open_run

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
