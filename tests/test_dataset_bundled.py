"""The bundled prompt set: enough prompts, the promised length spread, and in sync with its generator."""

import importlib.util
from pathlib import Path

import pytest

from jobs.dataset import BUNDLED_PROMPTS, DatasetConfig, load_dataset

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("make_prompts", ROOT / "tools" / "make_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bundled():
    return load_dataset(DatasetConfig())


@pytest.fixture(scope="module")
def lengths(bundled):
    return _generator().token_lengths([r.prompt for r in bundled.records])


def test_default_path_is_the_bundled_file_and_every_row_is_valid(bundled):
    assert Path(bundled.path) == BUNDLED_PROMPTS and bundled.format == "jsonl"
    assert len(bundled.records) >= 500 and bundled.errors == []
    assert all(not r.key.startswith("prompts-") for r in bundled.records)  # every key is given


def test_optional_fields_a_handful_and_no_size_overrides(bundled):
    records = bundled.records
    assert 3 <= sum(r.negative_prompt is not None for r in records) <= 20
    assert 3 <= sum(r.seed is not None for r in records) <= 20
    # The default job runs one resolution, one step count, one guidance.
    assert all(r.width is r.height is r.steps is r.guidance_scale is None for r in records)


def test_length_spread_from_one_word_to_hundreds_of_tokens(bundled, lengths):
    assert min(len(r.prompt.split()) for r in bundled.records) == 1
    # Token counts include [CLS] and [SEP].
    assert sum(n > 300 for n in lengths) >= 3
    assert max(lengths) <= 500
    captions = sum(5 <= n <= 60 for n in lengths)
    assert captions >= 0.6 * len(lengths), f"only {captions} of {len(lengths)} are 5-60 tokens"
    # Every default text bucket (64, 128, 256, 512) gets prompts.
    for low, high in ((1, 64), (65, 128), (129, 256), (257, 512)):
        assert any(low <= n <= high for n in lengths), (low, high)


def test_committed_file_is_the_generator_output():
    generator = _generator()
    assert BUNDLED_PROMPTS.read_text(encoding="utf-8") == generator.render(generator.build()), \
        "jobs/data/prompts.jsonl is stale: run python tools/make_prompts.py"
