"""Config validation: typos and bad values fail at compose/typing time, naming key, value and choices."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from tests.helpers import compose_cfg


def test_default_config_composes_typed():
    cfg = compose_cfg(["output_dir=/tmp/x"])
    assert cfg.model.name == "sana_tiny" and cfg.model.family == "sana"
    assert cfg.sampling.height == 128 and cfg.bcg.batch_sizes == [8]
    assert cfg.sink.format == "jpg"


IMAGE_PRESETS = ["sana", "sana_tiny", "flux", "flux_tiny", "qwen_image", "longcat_image", "glm_image"]
#: image presets whose signature is the exact caption length: one row a batch, so nothing is padded
ONE_ROW_PRESETS = ["z_image", "z_image_tiny"]
VIDEO_PRESETS = ["wan", "wan_tiny", "sana_video", "sana_video_tiny", "ltx2", "ltx2_tiny", "minimax_h3",
                 "minimax_h3_tiny"]


def test_the_job_warms_up_on_live_calls_and_the_runner_on_random_data():
    from bcg import RunnerConfig

    assert compose_cfg(["output_dir=/tmp/x"]).bcg.warmup == "live"
    assert RunnerConfig().warmup == "random"  # the library's contract: a first call already replays


@pytest.mark.parametrize("bcg", ["on", "off"])
def test_default_pool_is_one_shape_for_every_family(bcg):
    """Issue 30: a job runs every batch at one shape by default, so a sample's bytes do not depend on
    its neighbours, the partition or a resume; graphs off keeps that pool (on and off give the same
    bytes). Images at [8]; a video preset at [1] (one video would otherwise denoise 8, and at real size
    a video costs the same at batch 1 and 2); Z-Image at [1]: a signature a caption length, so [8]
    would pad most batches."""
    for preset in IMAGE_PRESETS + ONE_ROW_PRESETS + VIDEO_PRESETS:
        cfg = compose_cfg([f"model={preset}", f"bcg={bcg}", "output_dir=/tmp/x", "model.path=/m"])
        want = [1] if preset in VIDEO_PRESETS + ONE_ROW_PRESETS else [8]
        assert cfg.bcg.batch_sizes == want, preset
    # an override on the command line still wins over a preset's pool
    cfg = compose_cfg(["model=wan_tiny", f"bcg={bcg}", "bcg.batch_sizes=[1,2,4,8]", "output_dir=/tmp/x"])
    assert cfg.bcg.batch_sizes == [1, 2, 4, 8]


def test_typo_in_key_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(["sampling.stpes=4"])
    assert "stpes" in str(e.value.__cause__ or e.value)


def test_wrong_type_fails_at_compose():
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(["sampling.steps=many"])
    assert "steps" in str(e.value.__cause__ or e.value)


@pytest.mark.parametrize("override,needle", [
    ("sampling.steps=0", "sampling.steps=0"),
    ("model.dtype=float8", "float32, bfloat16, float16"),
    ("model.text_buckets=[]", "model.text_buckets"),
    ("bcg.batch_sizes=[0,2]", "bcg.batch_sizes"),
    ("device=tpu", "auto, cpu, cuda"),
    ("sink.format=gif", "sink.format"),
    ("job.partition=3/2", "job.partition='3/2'"),
    ("dataset.on_error=ignore", "dataset.on_error"),
    ("bcg.warmup=hot", "bcg.warmup='hot' is not a warm-up; choose one of random, live"),
])
def test_bad_values_name_key_and_allowed(override, needle):
    with pytest.raises(ValueError) as e:
        compose_cfg([override, "output_dir=/tmp/x"])
    assert needle in str(e.value)


def test_unknown_model_preset_lists_known():
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(["model=sana_huge"])
    msg = str(e.value)
    assert "sana_huge" in msg and "sana_tiny" in msg
