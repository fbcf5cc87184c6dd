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
from jobs.plan.identity import DEVICE_PENDING, Renderer, run_identity
from tests.helpers import compose_cfg


CPU, CUDA = Renderer("cpu", 2), Renderer("cuda:0", 2)


def identity_of(*overrides: str, renderer: Renderer = CPU) -> dict:
    """The identity a worker rendering on `renderer` claims (a CPU one: the batch-dependent kernels
    by default, so its batching is in it)."""
    return run_identity(compose_cfg(["output_dir=/tmp/x", *overrides]), "digest", 3, device=renderer.identity())


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


def test_the_batch_invariant_mode_follows_the_renderer_by_default():
    """bcg.invariant=null: on with CUDA (the pool leaves the identity), off on the CPU (the pool is in
    it), off with the compiled forward, whose kernels the mode does not replace; set, it holds on
    either; and while the device part is pending (`jobs.plan` with device=auto) neither is known:
    the first worker settles both (tests/test_cpu_threads.py)."""
    pool = {"batch_sizes": [8], "pad_short_batches": True, "batch_grow": "off", "batch_grow_max": 64}
    cuda, cpu = identity_of(renderer=CUDA), identity_of()
    assert cuda["invariant"] is True and "batching" not in cuda
    assert cpu["batching"] == pool and "invariant" not in cpu
    assert identity_of("bcg.invariant=false", renderer=CUDA)["batching"] == pool
    assert identity_of("bcg.compile=true", renderer=CUDA)["batching"] == pool
    assert identity_of("bcg.invariant=true")["invariant"] is True and "batching" not in identity_of("bcg.invariant=true")
    pending = run_identity(compose_cfg(["output_dir=/tmp/x", "device=auto"]), "digest", 3)
    assert pending["device"] == DEVICE_PENDING["device"] and "batching" not in pending and "invariant" not in pending
    on_cuda = run_identity(compose_cfg(["output_dir=/tmp/x", "device=cuda"]), "digest", 3)  # known at plan time
    assert on_cuda["invariant"] is True and "device" not in on_cuda


def test_a_gpu_run_of_before_the_mode_was_the_default_is_told_how_to_resume(tmp_path):
    """A CUDA run made while the mode was off by default holds its pool; a plain rerun now runs the
    mode, is refused, and is told the overrides that resume it: they do. The other way round (a CPU run
    made with bcg.invariant=true, rerun plainly) is told to pass the mode back."""
    open_run(tmp_path, identity_of("bcg.invariant=false", renderer=CUDA), overwrite=False)
    with pytest.raises(UserError) as e:
        open_run(tmp_path, identity_of(renderer=CUDA), overwrite=False)
    hint = str(e.value).split("pass its batching back: ", 1)[1].split()
    assert hint[0] == "bcg.invariant=false" and "bcg.batch_sizes=[8]" in hint
    open_run(tmp_path, identity_of(*hint, renderer=CUDA), overwrite=False)
    other = tmp_path / "other"
    open_run(other, identity_of("bcg.invariant=true"), overwrite=False)
    with pytest.raises(UserError) as e:
        open_run(other, identity_of(), overwrite=False)
    assert "pass its batch-invariant mode back: bcg.invariant=true" in str(e.value)
    open_run(other, identity_of("bcg.invariant=true"), overwrite=False)


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
