"""Run identity: every setting that changes output bytes is in run.json, batching included; and
run.json is published without hard links where the filesystem has none."""

from __future__ import annotations

import errno
import json
import os

import pytest

from jobs.errors import UserError
from jobs.output.layout import RUN_FILE
from jobs.output.claim import open_run
from jobs.plan.identity import run_identity
from tests.helpers import compose_cfg


def identity_of(*overrides: str) -> dict:
    return run_identity(compose_cfg(["output_dir=/tmp/x", *overrides]), "digest", 3)


def test_a_resume_with_other_batch_sizes_is_refused_naming_the_field(tmp_path):
    """Batch size changes bytes (5 of 40 JPEGs differed between batch 1 and 8 on SANA), so a resume
    with another batching would mix two outputs in one folder."""
    open_run(tmp_path, identity_of("bcg.batch_sizes=[1,2,4,8]"), overwrite=False)
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(b"committed")  # stands for a committed shard: a refusal leaves it alone
    for override, field in (("bcg.batch_sizes=[1]", "batching.batch_sizes: [1, 2, 4, 8] -> [1]"),
                            ("bcg.pad_short_batches=false", "batching.pad_short_batches: true -> false")):
        with pytest.raises(UserError) as e:
            open_run(tmp_path, identity_of(override), overwrite=False)
        assert field in str(e.value) and "job.overwrite=true" in str(e.value)
    assert shard.read_bytes() == b"committed"
    open_run(tmp_path, identity_of("bcg.batch_sizes=[1,2,4,8]"), overwrite=False)  # the same run resumes


@pytest.mark.parametrize("model, now", [("sana_tiny", "[8]"), ("wan_tiny", "[1]")])
def test_a_run_of_the_old_default_pool_is_told_how_to_resume(tmp_path, model, now):
    """Session 31 changed the image presets' pool from [1, 2, 4, 8] to [8], session 47 the video
    presets' to [1]: a plain rerun of an older run is refused, and the refusal gives the overrides
    that resume it; they do."""
    open_run(tmp_path, identity_of(f"model={model}", "bcg.batch_sizes=[1,2,4,8]"), overwrite=False)
    with pytest.raises(UserError) as e:
        open_run(tmp_path, identity_of(f"model={model}"), overwrite=False)
    msg = str(e.value)
    assert f"batching.batch_sizes: [1, 2, 4, 8] -> {now}" in msg
    hint = msg.split("pass its batching back: ", 1)[1].split()
    assert hint == ["bcg.batch_sizes=[1,2,4,8]"]
    open_run(tmp_path, identity_of(f"model={model}", *hint), overwrite=False)
    # no hint when more than the batching differs: passing the pool back would not resume it
    with pytest.raises(UserError) as e:
        open_run(tmp_path, identity_of(f"model={model}", "sampling.steps=3"), overwrite=False)
    assert "pass its batching back" not in str(e.value)


def test_settings_that_do_not_change_bytes_stay_out_of_the_identity():
    assert identity_of("job.progress=false", "bcg.enabled=false") == identity_of()


def test_run_json_is_published_by_rename_where_hard_links_fail(tmp_path, monkeypatch):
    """Some FUSE and object-store mounts refuse link(2) with EPERM; the claim falls back to
    check + rename (as shard commits do), still refusing a different run. os.link is made to fail
    the way such a mount fails: there is no such filesystem on the test machine."""
    def no_links(src, dst, **kw):
        raise OSError(errno.EPERM, "Operation not permitted", str(src))

    monkeypatch.setattr(os, "link", no_links)
    open_run(tmp_path, identity_of(), overwrite=False)
    assert json.loads((tmp_path / RUN_FILE).read_text()) == json.loads(json.dumps(identity_of(), default=str))
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    open_run(tmp_path, identity_of(), overwrite=False)  # the same run: claimed again
    with pytest.raises(UserError, match="sampling.steps: 8 -> 3"):
        open_run(tmp_path, identity_of("sampling.steps=3"), overwrite=False)
