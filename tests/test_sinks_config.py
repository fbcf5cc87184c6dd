"""SinkConfig validation: every bad value is named with its key and the allowed values."""

import pytest
from omegaconf import OmegaConf

from sinks import SinkConfig


def test_defaults_are_valid():
    cfg = SinkConfig()
    assert (cfg.format, cfg.quality, cfg.maxcount, cfg.maxsize, cfg.encode_threads, cfg.queue_size) == (
        "jpg", 95, 1000, 1_000_000_000, 2, 64
    )


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("format", "jpeg", "one of jpg, png, webp"),
        ("format", "PNG", "one of jpg, png, webp"),
        ("quality", 0, "1..100"),
        ("quality", 101, "1..100"),
        ("maxcount", 0, "1..10000000"),
        ("maxcount", True, "1..10000000"),
        ("maxcount", 10_000_001, "1..10000000"),
        ("maxsize", -1, "1..2**40"),
        ("encode_threads", 0, "1..256"),
        ("queue_size", 0, "1..100000"),
    ],
)
def test_bad_value_names_key_value_and_allowed(field, value, expected):
    with pytest.raises(ValueError) as info:
        SinkConfig(**{field: value})
    message = str(info.value)
    assert f"sink.{field}={value!r}" in message
    assert expected in message


def test_structured_config_round_trip_validates():
    # The job registers this class with Hydra and converts the node back with to_object,
    # which is where __post_init__ runs.
    node = OmegaConf.structured(SinkConfig)
    node.format = "webp"
    assert OmegaConf.to_object(node) == SinkConfig(format="webp")
    node.format = "gif"
    with pytest.raises(ValueError, match=r"sink.format='gif'.*one of jpg, png, webp"):
        OmegaConf.to_object(node)
