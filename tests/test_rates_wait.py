"""The fixed part of a worker's wait beside its rate (jobs/telemetry/rates.py, jobs/plan/estimate.py): the
first_batch_s of the job a rate came from, read from files another process wrote, so anything but a
positive number is dropped, never shown."""

from __future__ import annotations

import json

import pytest

from jobs.plan.estimate import Estimate
from jobs.telemetry import rates


@pytest.mark.parametrize("wait,kept", [(7.25, 7.25), (3, 3.0), ("7", None), (True, None), (-1.0, None), (0, None),
                                       (None, None), ([7], None)])
def test_a_cached_wait_is_kept_only_where_it_is_a_positive_number(monkeypatch, tmp_path, wait, kept):
    monkeypatch.setenv(rates.RATE_CACHE_ENV, str(tmp_path / "rates.json"))
    entry = {"cost_per_s": 2.0, "items": 3, "seconds": 1.5, "first_batch_s": wait}
    (tmp_path / "rates.json").write_text(json.dumps({"m|cpu|lossless": entry}))
    (rate,) = rates.cached_rates("m", "lossless")
    assert rate.first_batch_s == kept


def test_a_summary_gives_the_wait_of_the_output_it_is_in(tmp_path):
    assert rates.first_batch_wait(tmp_path) is None  # no summary.json
    (tmp_path / "summary.json").write_text(json.dumps({"first_batch_s": 12.5}))
    assert rates.first_batch_wait(tmp_path) == 12.5
    (tmp_path / "summary.json").write_text(json.dumps({"first_batch_s": None}))  # a rerun with nothing to do
    assert rates.first_batch_wait(tmp_path) is None
    (tmp_path / "summary.json").write_text("[12.5]")  # damaged: another shape
    assert rates.first_batch_wait(tmp_path) is None


@pytest.mark.parametrize("left,wait,shown", [(10, 14.2, True), (0, 14.2, False), (10, None, False)])
def test_the_estimate_adds_the_wait_only_with_items_left(left, wait, shown):
    rate = rates.Rate(cost_per_s=2.0, items=3, seconds=1.5, source="here", device="cpu", first_batch_s=wait)
    lines = Estimate(items=10, items_left=left, cost_left=4.0 * left, seconds=2.0 * left, rate=rate).lines()
    wait_lines = [line for line in lines if "before its first batch" in line]
    assert wait_lines == (["  plus 14.2s a worker before its first batch (its start-up, the plan and the model's "
                           "load, as that job waited)"] if shown else [])


def test_a_rate_is_cached_under_the_preset_and_its_transformers_architecture():
    """model=sana at 600M and at 1.6B share a preset name, not a speed; the diffusers version that saved a
    config (its `_`-keys) is no other architecture."""
    small = {"_class_name": "SanaTransformer2DModel", "_diffusers_version": "0.32.0", "num_layers": 20}
    assert rates.rate_model("sana", small) == rates.rate_model("sana", dict(small, _diffusers_version="0.42.1"))
    assert rates.rate_model("sana", small) != rates.rate_model("sana", dict(small, num_layers=28))
    assert rates.rate_model("sana", small).startswith("sana#") and rates.rate_model("sana", None) == "sana"
