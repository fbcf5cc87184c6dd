"""One test per class of issue 26's hostile cases: each asserts the message, that what was committed
and must not change did not, and (for runs) that a plain rerun leaves every key exactly once."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from jobs.errors import UserError, environment_failure
from jobs.output.audit import verify_output
from tests.helpers import compose_cfg, prompts, write_jsonl
from tests.test_trust_property import FAST, indexed_keys, run_job


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("classes")
    rows = prompts(8)
    data = write_jsonl(tmp / "prompts.jsonl", rows)
    out = tmp / "template"
    assert run_job([f"dataset.path={data}", f"output_dir={out}", *FAST]) == 0
    return {"rows": rows, "data": data, "out": out}


def _copy(finished, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished["out"], out)
    return out


def _bytes(out: Path, names) -> dict:
    return {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in names}


def _rerun(finished, out, *extra) -> int:
    return run_job([f"dataset.path={finished['data']}", f"output_dir={out}", *FAST, *extra])


def test_a_deleted_shard_of_a_done_unit_is_regenerated_by_a_plain_rerun(finished, tmp_path, caplog):
    out = _copy(finished, tmp_path)
    victim = "shard-u0000000-0000.tar"
    others = sorted(p.name for p in out.glob("shard-*.tar") if p.name != victim)
    before = _bytes(out, others)
    (out / victim).unlink()
    problems = verify_output(out).problems
    assert any(victim in p and "a plain rerun" in p for p in problems), problems
    with caplog.at_level(logging.INFO):
        assert _rerun(finished, out) == 0
    assert "done unit 0 no longer holds what it committed (shard-u0000000-0000.tar is missing" in caplog.text
    assert _bytes(out, others) == before  # the untouched shards keep their bytes
    assert verify_output(out).problems == []
    assert indexed_keys(out) == Counter(r["key"] for r in finished["rows"])


def test_verify_says_whether_the_run_is_complete(finished, tmp_path):
    """verify said OK for a run holding none of its planned samples: its exit speaks of what is committed, so its
    last line says whether that is all of the plan."""
    out = _copy(finished, tmp_path)
    assert verify_output(out).completeness() == "the run is complete (8 of 8 planned items)"
    for shard in out.glob("shard-u0000000-*"):
        shard.unlink()
    for manifest in (out / "_manifest").glob("shard-u0000000-*"):
        manifest.unlink()
    shutil.rmtree(out / "_plan" / "done")
    report = verify_output(out)
    assert report.completeness().startswith(f"the run is NOT complete: {report.samples} of 8 planned items")
    assert report.samples < 8
    (out / "_plan" / "plan.json").write_text("{")
    report = verify_output(out)
    assert report.completeness() == "no readable plan to count against"
    assert any(p.startswith("_plan/plan.json is missing or unreadable") and "job.verify=full" in p
               for p in report.problems), report.problems  # not an OK: no rerun could match its samples


def test_a_foreign_shard_is_left_alone_listed_and_never_indexed(finished, tmp_path):
    out = _copy(finished, tmp_path)
    other = tmp_path / "other"
    odata = write_jsonl(tmp_path / "o.jsonl", [{"key": "zz1", "prompt": "another run"}])
    assert run_job([f"dataset.path={odata}", f"output_dir={other}", *FAST]) == 0
    # dropped under the next name of an unfinished unit, as the attacker did
    shutil.rmtree(out / "_plan" / "done")
    shutil.copy(other / "shard-u0000000-0000.tar", out / "shard-u0000001-0009.tar")
    assert _rerun(finished, out) == 0
    assert (out / "shard-u0000001-0009.tar").read_bytes() == (other / "shard-u0000000-0000.tar").read_bytes()
    report = verify_output(out)
    assert report.problems == [] and any("shard-u0000001-0009.tar: a .tar with no manifest" in f for f in report.foreign)
    keys = indexed_keys(out)
    assert "zz1" not in keys and keys == Counter(r["key"] for r in finished["rows"])


def _read_once(finished, out: Path) -> None:
    """Every dataset key exactly once, as readers of the folder see it: webdataset over a glob of its shards,
    pyarrow over its parquet sidecars (folder discovery, as the README reads them), and `python -m jobs.verify`."""
    import pyarrow.dataset as ds

    from tests.test_resume_kill import cli, log_of, shard_keys

    want = Counter(r["key"] for r in finished["rows"])
    assert shard_keys(out) == want
    table = ds.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table(columns=["key"])
    assert Counter(table.column("key").to_pylist()) == want
    verified = cli(str(out), module=("-m", "jobs.verify"))
    assert verified.returncode == 0 and "not the run's" not in log_of(verified), log_of(verified)


def test_a_deleted_manifest_of_a_done_unit_is_restored_from_its_marker_and_nothing_is_read_twice(
        finished, tmp_path, caplog):
    """The shard stayed, its manifest gone: the rerun left it alone and generated its samples again beside it, so
    a glob of the folder read them twice (found in session 55). Its done marker vouches for it: adopted again."""
    out = _copy(finished, tmp_path)
    victim = "shard-u0000000-0001.tar"
    shards = sorted(p.name for p in out.glob("shard-*"))
    before = _bytes(out, shards)
    (out / "_manifest" / f"{victim}.json").unlink()
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    _read_once(finished, out)
    assert f"{victim}: its manifest was missing; the shard is byte for byte what its done marker" in caplog.text
    assert sorted(p.name for p in out.glob("shard-*")) == shards and _bytes(out, shards) == before  # none again
    assert (out / "_manifest" / f"{victim}.json").exists() and not (out / "_quarantine").exists()


def test_a_shard_without_a_manifest_in_an_unfinished_unit_is_moved_aside_and_generated_again(
        finished, tmp_path, caplog):
    """No done marker vouches for it (its worker was killed before the marker): its keys are generated again, so
    it goes to _quarantine/ with its sidecars, said in the log and summary.json, and the folder reads once."""
    out = _copy(finished, tmp_path)
    victim = "shard-u0000001-0000.tar"
    (out / "_plan" / "done" / "unit-0000001.json").unlink()
    (out / "_manifest" / f"{victim}.json").unlink()
    moved = (out / victim).read_bytes()
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    _read_once(finished, out)
    assert f"shard {victim} does not match what was committed (it has no manifest" in caplog.text
    assert "a glob of the folder would read them twice" in caplog.text
    assert (out / "_quarantine" / victim).read_bytes() == moved
    assert (out / "_quarantine" / f"{victim}.parquet").exists()  # its sidecars went along
    summary = json.loads((out / "summary.json").read_text())
    assert [q["url"] for q in summary["quarantined"]] == [victim]


@pytest.mark.parametrize("signed", [False, True])
def test_an_edited_key_in_a_manifest_is_not_adopted(finished, tmp_path, caplog, signed):
    # Edited by hand, the manifest's own digest no longer matches: read as damaged. Rewritten whole (its
    # digest made anew, as a tool that knows the format would), the unit's keys still refuse it.
    from sinks.manifest import load_manifest, write_manifest

    out = _copy(finished, tmp_path)
    path = out / "_manifest" / "shard-u0000000-0001.tar.json"
    if signed:
        record = load_manifest(out, "shard-u0000000-0001.tar")
        record.keys[0] = record.keys[0][:-1] + "X"
        write_manifest(out, record)
    else:
        doc = json.loads(path.read_text())
        doc["keys"][0] = doc["keys"][0][:-1] + "X"
        path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    assert ("its manifest lists 1 key(s) this unit does not have" if signed else
            "its own digest does not match: damaged") in caplog.text
    assert verify_output(out).problems == []
    assert indexed_keys(out) == Counter(r["key"] for r in finished["rows"])


def test_a_damaged_plan_json_is_one_message_then_restored_by_job_verify_full(finished, tmp_path, caplog):
    out = _copy(finished, tmp_path)
    shards = sorted(p.name for p in out.glob("shard-*.tar"))
    before = _bytes(out, shards)
    (out / "_plan" / "plan.json").write_text("{damaged")
    with caplog.at_level(logging.ERROR):
        assert _rerun(finished, out) == 2
    assert "plan.json is damaged" in caplog.text and "job.verify=full" in caplog.text
    assert _rerun(finished, out, "job.verify=full") == 0
    assert _bytes(out, shards) == before and verify_output(out).problems == []


@pytest.mark.parametrize("lost", ["_plan/plan.json", "_plan"])
def test_a_deleted_plan_is_one_message_then_restored_by_job_verify_full(finished, tmp_path, caplog, lost):
    """plan.json deleted (or the whole _plan folder, its done markers too): a plain rerun used to be told
    only of job.overwrite, which deletes every committed shard. The plan is deterministic: job.verify=full
    plans again, checks the new plan against run.json and restores it; the committed shards keep their
    bytes and are adopted, not made again (without done markers too: the resume finds them by their manifests)."""
    out = _copy(finished, tmp_path)
    shards = sorted(p.name for p in out.glob("shard-*.tar"))
    before = _bytes(out, shards)
    gone = out / lost
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    problems = verify_output(out).problems  # jobs.verify said OK here, "no readable plan to count against"
    assert len(problems) == 1 and "job.verify=full" in problems[0], problems
    with caplog.at_level(logging.ERROR):
        assert _rerun(finished, out) == 2
    assert "plan.json) is missing" in caplog.text and "job.verify=full" in caplog.text
    assert _bytes(out, shards) == before  # refused: nothing deleted
    # Another dataset is not this run's: refused again, nothing deleted, no plan left behind.
    other = write_jsonl(tmp_path / "other.jsonl", prompts(5))
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert run_job([f"dataset.path={other}", f"output_dir={out}", *FAST, "job.verify=full"]) == 2
    assert "so its plan cannot be restored from them. Nothing was deleted" in caplog.text
    assert _bytes(out, shards) == before and not (out / "_plan" / "plan.json").exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out, "job.verify=full") == 0
    assert "restored" in caplog.text and "from a new plan of the same dataset and config" in caplog.text
    assert _bytes(out, shards) == before and not (out / "_quarantine").exists()  # adopted, not made again
    assert verify_output(out).problems == []
    assert indexed_keys(out) == Counter(r["key"] for r in finished["rows"])


def test_a_deleted_run_json_is_restored_not_answered_with_overwrite(finished, tmp_path, caplog):
    out = _copy(finished, tmp_path)
    (out / "run.json").unlink()
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    assert "holds this job's identity: restoring it" in caplog.text and "job.overwrite" not in caplog.text
    assert verify_output(out).problems == []


def test_a_flipped_bit_that_leaves_run_json_valid_is_restored_from_the_plan(finished, tmp_path, caplog):
    # Found by the property test's seed 217: one bit (0x10) turned a key of the identity into another
    # key, still valid JSON, so run.json named another run than its own plan, and the rerun was refused.
    out = _copy(finished, tmp_path)
    shards = sorted(p.name for p in out.glob("shard-*"))
    before = _bytes(out, shards)
    raw = (out / "run.json").read_bytes()
    at = raw.index(b'"attention_head_dim"') + 4  # the "e" of "attention"
    (out / "run.json").write_bytes(raw[:at] + bytes([raw[at] ^ 0x10]) + raw[at + 1:])
    assert b'"attuntion_head_dim"' in (out / "run.json").read_bytes()
    # jobs.verify names run.json, and checks the shards as the plan's run: before, every shard was "another
    # run's" and every key one to generate again.
    report = verify_output(out)
    assert len(report.problems) == 1 and report.problems[0].startswith(
        "run.json names another run than _plan/plan.json"), report.problems
    assert report.foreign == [] and report.samples == 8
    # Another config is still another run: refused, and nothing deleted.
    with caplog.at_level(logging.ERROR):
        assert _rerun(finished, out, "sampling.seed=7") == 2
    assert "holds a run with a different dataset or config" in caplog.text and _bytes(out, shards) == before
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    assert "run.json disagrees with _plan/plan.json, which holds this job's identity" in caplog.text
    plan = json.loads((out / "_plan" / "plan.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert {k: v for k, v in run.items() if k != "provenance"} == plan["identity"]
    assert run["provenance"]["restored"] and _bytes(out, shards) == before and verify_output(out).problems == []


def test_a_flipped_bit_in_a_done_markers_sha256_is_caught_by_its_digest_and_rewritten(finished, tmp_path, caplog):
    # Found by the property test's seed 881: the marker still parsed, its sizes and stamps matched, so the
    # resume check trusted it, and the index took the flipped sha256 from it.
    out = _copy(finished, tmp_path)
    shards = sorted(p.name for p in out.glob("shard-*"))
    before = _bytes(out, shards)
    marker = out / "_plan" / "done" / "unit-0000001.json"
    body = json.loads(marker.read_text())
    good = body["shards"][0]["sha256"]
    body["shards"][0]["sha256"] = ("0" if good[0] != "0" else "1") + good[1:]  # one hex digit, as a bit flip does
    marker.write_text(json.dumps(body))
    problems = verify_output(out).problems
    assert any("unit-0000001.json: unreadable or damaged" in p and "a plain rerun" in p for p in problems), problems
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    assert "done unit 1 was checked (its done marker is unreadable or damaged): its shards hold what it " \
           "committed, and its done marker is rewritten to record them as they are now" in caplog.text, caplog.text
    assert json.loads(marker.read_text())["shards"][0]["sha256"] == good
    assert _bytes(out, shards) == before and verify_output(out).problems == []


def test_a_done_marker_written_before_the_digest_is_read_as_it_is(finished, tmp_path, caplog):
    out = _copy(finished, tmp_path)
    marker = out / "_plan" / "done" / "unit-0000001.json"
    body = json.loads(marker.read_text())
    del body["digest"]
    marker.write_text(json.dumps(body))
    assert verify_output(out).problems == []
    with caplog.at_level(logging.WARNING):
        assert _rerun(finished, out) == 0
    assert "done unit" not in caplog.text and "digest" not in json.loads(marker.read_text())  # trusted, untouched


def test_a_lost_lease_is_one_line_and_commits_nothing(tmp_path):
    from jobs.worker.lease import LeaseLost, Leaser

    leaser = Leaser(tmp_path, "me", 600)
    lease = leaser.try_take(3)
    leaser.check(3)  # held: no error
    os.rename(lease.path, tmp_path / "taken-over")  # another worker broke it as expired
    with pytest.raises(LeaseLost, match=r"lost the lease on unit 3 after \d+s: another worker took it over"):
        leaser.check(3)
    assert LeaseLost.exit_code == 75
    assert "-" + lease.token in lease.temp_tag and str(os.getpid()) in lease.temp_tag


def test_a_stale_writer_never_shares_a_temp_with_its_successor(tmp_path):
    import numpy as np

    from sinks import AsyncSink, Sample, SinkConfig
    from sinks.errors import CommitRefused
    from sinks.shard_writer import Owner

    def refuse():
        raise CommitRefused("lost")

    stale = AsyncSink(tmp_path, SinkConfig(format="png", maxcount=2), name_pattern="shard-u0000000-{index:04d}.tar",
                      owner=Owner(run="r", temp_tag="hostA-1-aaaa", guard=refuse))
    stale.put(Sample("k0", np.zeros((8, 8, 3), np.uint8), "c"))
    live = AsyncSink(tmp_path, SinkConfig(format="png", maxcount=2), name_pattern="shard-u0000000-{index:04d}.tar",
                     owner=Owner(run="r", temp_tag="hostB-2-bbbb"))
    live.put(Sample("k0", np.zeros((8, 8, 3), np.uint8), "c"))
    records = live.close()
    with pytest.raises(CommitRefused):
        stale.close()
    assert [r.url for r in records] == ["shard-u0000000-0000.tar"] and records[0].run == "r"
    assert not list(tmp_path.glob(".*.tmp"))  # each removed its own temp; neither touched the other's


def test_inputs_fifo_compressed_latin1(tmp_path, caplog):
    from jobs.dataset.paths import check_file

    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is a pipe or socket, not a regular file"):
        check_file(fifo, str(fifo))
    gz = tmp_path / "p2.jsonl"
    import gzip

    gz.write_bytes(gzip.compress(b'{"prompt": "x"}\n'))
    with pytest.raises(UserError, match=r"is gzip-compressed.*gunzip -k"):
        check_file(gz, str(gz))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"key": "a", "prompt": "caf\xe9"}\n{"key": "b", "prompt": "ok"}\n')
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        assert run_job([f"dataset.path={latin}", "dataset.on_error=skip", f"output_dir={out}", *FAST]) == 0
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["line"], "not UTF-8" in e["reason"]) for e in errors] == [(1, True)]
    assert indexed_keys(out) == Counter({"b": 1})


@pytest.mark.parametrize("override", ["job.lease_ttl_s=inf", "job.log_every_s=-1", "sink.encode_threads=0",
                                      "sink.encode_threads=100000", "plan.workers=-2", "plan.workers=100000",
                                      "job.log_every_s=nan", "bcg.max_graph_memory_gb=inf"])
def test_numeric_config_values_have_limits(override):
    key = override.split("=")[0]
    with pytest.raises(UserError, match=key.split(".")[-1]):
        compose_cfg([override])


def test_environment_failures_are_one_message():
    from sinks.errors import SinkError

    full = OSError(errno.ENOSPC, "No space left on device", "/data/out/.shard-u0000000-0000.tar.tmp")
    text = environment_failure(full)
    assert "the disk is full writing /data/out/.shard-u0000000-0000.tar.tmp" in text and "rerun the same command" in text
    wrapped = SinkError("committing shard x failed: OSError: ...")
    wrapped.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert environment_failure(wrapped).startswith("committing shard x failed")
    assert environment_failure(ValueError("a bug")) is None


def test_inspect_treats_member_names_as_untrusted(tmp_path):
    """The contact sheet's gallery and --pages alike: a crafted member name (../../x) or one with a folder in it
    (`tar -C dir .` makes sub/x) picks no path; --pages wrote ../../evil.png outside output_dir (session 55)."""
    from jobs.look.pages import Filter
    from jobs.look.report import inspect_output, inspect_pages
    from PIL import Image

    out = tmp_path / "out"
    out.mkdir()
    png = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(png, "PNG")
    with tarfile.open(out / "shard-u0000000-0000.tar", "w") as tar:
        for stem in ("../../evil", "sub/dir"):
            for name, data in ((f"{stem}.png", png.getvalue()), (f"{stem}.json", b'{"key": "e"}')):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    report = inspect_output(out)
    folder, matched = inspect_pages(out, None, Filter(), page_size=10)
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert not (tmp_path / "evil.png").exists() and not any("evil" in w or "sub/" in w for w in written), written
    assert all(w.startswith("out/") for w in written), written
    assert len(report.samples) == 2 and matched == 2
    assert len(list((folder / "images").glob("member-*.png"))) == 2


def test_hydra_overrides_that_write_or_call_elsewhere_are_refused(monkeypatch):
    from jobs.cli_check import check_command_line

    for bad in ("hydra.run.dir=/tmp/elsewhere", "hydra.output_subdir=/tmp/x", "+hydra.callbacks.x._target_=os.getcwd",
                "hydra.sweep.dir=/tmp/sweeps"):
        with pytest.raises(UserError, match="changes where Hydra writes or what it calls"):
            check_command_line([bad])
    monkeypatch.setenv("BCGEN_ALLOW_HYDRA_PATHS", "1")
    check_command_line(["sampling.steps=2", "hydra.verbose=true"])


def test_an_output_dir_inside_another_runs_bookkeeping_is_refused(finished, tmp_path):
    out = _copy(finished, tmp_path)
    with pytest.raises(UserError, match="is inside .*_plan, the bookkeeping of the run in"):
        compose_cfg and run_job  # the job's check, before anything is written:
        from jobs.output.claim import check_writable

        check_writable(out / "_plan" / "mine")
    assert not (out / "_plan" / "mine").exists()


def test_an_index_that_lists_a_shard_twice_is_a_problem_a_plain_rerun_repairs(finished, tmp_path):
    """wids read every sample of a shard listed twice twice; verify said OK."""
    out = _copy(finished, tmp_path)
    index = json.loads((out / "index.wids.json").read_text())
    index["shardlist"] = index["shardlist"] + index["shardlist"][:1]
    (out / "index.wids.json").write_text(json.dumps(index))
    url = index["shardlist"][0]["url"]
    assert any(f"index.wids.json lists {url} 2 times" in p and "a plain rerun" in p for p in verify_output(out).problems)
    assert _rerun(finished, out) == 0
    assert verify_output(out).problems == []
