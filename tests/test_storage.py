"""Where output goes (jobs/output/storage.py): local paths, file:// URLs, object stores and their staging
folder, and the layouts refused because their workers could not share leases."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.errors import UserError
from jobs.output.storage import check_shared_staging, default_staging, protocol_of, resolve


def test_plain_paths_and_file_urls_are_local_folders(tmp_path):
    assert resolve(str(tmp_path), None).local == tmp_path and resolve(str(tmp_path), None).remote is None
    assert resolve(f"file://{tmp_path}", None).local == tmp_path
    assert protocol_of("outputs/x") is None and protocol_of("file:///x") is None and protocol_of("s3://b/p") == "s3"


def test_object_store_stages_in_a_folder_per_url(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    monkeypatch.setenv("BCGEN_STAGING_ROOT", str(tmp_path))
    out = resolve("s3://bucket/run/", None)
    assert out.remote == "s3://bucket/run" and out.local.parent == tmp_path
    assert out.local == default_staging("s3://bucket/run") != default_staging("s3://bucket/run2")
    assert resolve("s3://bucket/run", str(tmp_path / "shared")).local == tmp_path / "shared"


def test_missing_fsspec_implementation_says_what_to_install():
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(UserError, match=r"output_dir='gs://b/p' needs fsspec's gs:// implementation"):
        resolve("gs://b/p", None)
    with pytest.raises(UserError, match="not a protocol fsspec knows"):
        resolve("nosuchstore://b/p", None)


@pytest.mark.parametrize("tasks, env", [(2, {}), (1, {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})])
def test_workers_on_several_machines_need_a_shared_staging_folder(tasks, env, tmp_path):
    pytest.importorskip("s3fs")
    out = resolve("s3://bucket/run", None)
    with pytest.raises(UserError, match="job.staging_dir="):
        check_shared_staging(out, None, tasks, env)
    check_shared_staging(out, str(tmp_path), tasks, env)  # named: the user says every worker mounts it
    check_shared_staging(out, None, 1, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"})  # one node
    check_shared_staging(resolve(str(tmp_path), None), None, tasks, env)  # a local output_dir: leases work


def test_hydra_logs_of_an_object_store_run_go_to_its_staging_folder(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from jobs.config import register_configs
    from tests.helpers import CONF_DIR

    monkeypatch.setenv("BCGEN_STAGING_ROOT", str(tmp_path))
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for overrides, folder in ((["output_dir=s3://b/run"], default_staging("s3://b/run")),
                                  (["output_dir=s3://b/run", f"job.staging_dir={tmp_path}/s"], tmp_path / "s"),
                                  ([f"output_dir={tmp_path}/o"], tmp_path / "o")):
            cfg = compose("generate", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            assert Path(cfg.hydra.run.dir).parent == folder / "logs"


def test_unreachable_store_is_a_user_error(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    from jobs.output.mirror import Mirror
    from sinks.sidecars import MetaSpec

    # Nothing listens on port 9 of the loopback: the probe fails at once, and the message says where to look.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()
    try:
        mirror = Mirror(resolve("s3://nobucket/run", str(tmp_path)), MetaSpec())
        with pytest.raises(UserError, match="AWS_ACCESS_KEY_ID"):
            mirror.check()
    finally:
        S3FileSystem.clear_instance_cache()  # the next test's client must see its own endpoint
