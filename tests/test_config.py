"""Config validation: typos and bad values fail at compose/typing time, naming key, value and choices."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from tests.helpers import compose_cfg


def test_default_config_composes_typed():
    cfg = compose_cfg(["output_dir=/tmp/x"])
    assert cfg.model.name == "sana_tiny" and cfg.model.family == "sana"
    assert cfg.sampling.height == 128 and cfg.bcg.batch_sizes == [1, 2, 4, 8]
    assert cfg.sink.format == "jpg"


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
