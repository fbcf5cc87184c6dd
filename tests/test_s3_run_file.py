"""An object store's run.json: when a rerun may replace the remote run, and when it must not.

The staging folder's run.json is compared with the bucket's by the run they name, not by bytes:
a run.json restored from the plan (the remote's was deleted or damaged) and one rewritten by
`job.extend` are the same run, and wiping the bucket for them would delete the very shards the
run resumes. moto's S3 server on the loopback; each rerun from a fresh staging folder (another
machine), as the property test in tests/test_trust_property.py runs them.
"""

from __future__ import annotations

from collections import Counter

import pytest

from jobs.output.audit import verify_output
from tests.helpers import prompts, write_jsonl
from tests.test_trust_property import FAST, indexed_keys, run_job

pytestmark = pytest.mark.slow


@pytest.fixture()
def s3(tmp_path):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    import fsspec

    from tests.s3_server import new_bucket, s3_server

    with s3_server():
        yield fsspec.filesystem("s3"), f"{new_bucket()}/run"


def _job(data, root, staging, *extra) -> int:
    return run_job([f"dataset.path={data}", f"output_dir=s3://{root}", f"job.staging_dir={staging}", *FAST, *extra])


def _shard_etags(fs, root) -> dict:
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[1]: fs.info(p)["ETag"] for p in fs.glob(f"{root}/shard-*")}


def _keys_once(fs, root, tmp_path, rows) -> None:
    local = tmp_path / "copy"
    fs.invalidate_cache()
    fs.get(f"{root}/", str(local), recursive=True)
    assert verify_output(local).problems == []
    assert indexed_keys(local) == Counter(r["key"] for r in rows)


@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_a_lost_remote_run_json_is_restored_and_no_shard_is_deleted(s3, tmp_path, damage):
    fs, root = s3
    rows = prompts(6)
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    assert _job(data, root, tmp_path / "a") == 0
    before = _shard_etags(fs, root)
    if damage == "delete":
        fs.rm_file(f"{root}/run.json")
    else:
        fs.pipe_file(f"{root}/run.json", b"{not json")
    assert _job(data, root, tmp_path / "b") == 0
    assert _shard_etags(fs, root) == before  # nothing wiped, nothing rewritten
    assert fs.cat_file(f"{root}/run.json").startswith(b"{\n")  # restored from the plan
    _keys_once(fs, root, tmp_path, rows)


def test_a_lost_remote_run_json_with_another_config_is_refused_and_nothing_is_deleted(s3, tmp_path, caplog):
    fs, root = s3
    data = write_jsonl(tmp_path / "p.jsonl", prompts(6))
    assert _job(data, root, tmp_path / "a") == 0
    before = _shard_etags(fs, root)
    fs.rm_file(f"{root}/run.json")
    assert _job(data, root, tmp_path / "b", "sampling.guidance_scale=3.0") == 2
    assert f"output_dir='s3://{root}' holds {sum(n.endswith('.tar') for n in before)} shard(s) but no run.json" in caplog.text
    assert _shard_etags(fs, root) == before


def test_extend_on_an_object_store_keeps_the_done_units_shards(s3, tmp_path):
    fs, root = s3
    rows = prompts(10)
    first = write_jsonl(tmp_path / "p.jsonl", rows[:6])
    assert _job(first, root, tmp_path / "a") == 0
    before = _shard_etags(fs, root)
    grown = write_jsonl(tmp_path / "p.jsonl", rows)
    assert _job(grown, root, tmp_path / "a", "job.extend=true") == 0
    after = _shard_etags(fs, root)
    assert {n: after.get(n) for n in before} == before  # the first run's shards, untouched
    assert len(after) > len(before)
    _keys_once(fs, root, tmp_path, rows)
