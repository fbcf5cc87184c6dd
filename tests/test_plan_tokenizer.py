"""The planner's tokenizer without transformers (jobs/plan/lengths.py: BackendTokenizer): the same
counts, and so the same plan bytes, as the family's own tokenizer; folders it cannot vouch for go
to the family's tokenizer."""

from __future__ import annotations

import json
import random
import shutil

import pyarrow.parquet as pq
import pytest

from jobs.models.registry import get_family
from jobs.models.text_encoders import load_tokenizer, minilm_path
from jobs.plan import lengths
from jobs.plan.build import plan_dataset
from jobs.plan.lengths import LengthTokenizer, backend_tokenizer, planning_tokenizer
from jobs.plan.units import unit_name
from tests.helpers import compose_cfg, write_jsonl

WORDS = ["red", "Fox", "don't", "4K!", "(octane_render)", "café", "naïve", "東京", "emoji😀", "x" * 101,
         "supercalifragilisticexpialidocious", "a.b,c;d", "UPPER", "12ab34", "\t", "\x01ctl", "--", "~`^|",
         "[MASK]", "[mask]", "x[SEP]y", "[UNK]!", "\x0b", "a\x0cb", "e\u0301", "\u3000", "a\xa0b", "ΣΑΣ",
         "İstanbul", "ﬁne", "\x7f", "3.14159", "１２３"]


def _texts(n: int = 400, seed: int = 5) -> list:
    rng = random.Random(seed)
    seps = [" ", " ", "  ", "\t", "\n", ""]
    long = " ".join(["word"] * 400)  # past the file's truncation (128) and padding settings
    return ["", " ", long] + ["".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(rng.randint(1, 40)))
                              for _ in range(n)]


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory):
    """A SANA checkpoint's layout as bcgen's real-size benchmark saves it (transformers'
    save_pretrained of MiniLM's tokenizer), with the component configs planning reads and no weights."""
    root = tmp_path_factory.mktemp("sana")
    load_tokenizer("minilm").save_pretrained(str(root / "tokenizer"))
    (root / "vae").mkdir()
    (root / "vae" / "config.json").write_text(json.dumps({"encoder_block_out_channels": [8] * 6}))
    (root / "transformer").mkdir()
    (root / "transformer" / "config.json").write_text(json.dumps({"patch_size": 1}))
    return root


def _family_tokenizer_loaded():
    raise AssertionError("the family's tokenizer was loaded")


@pytest.mark.parametrize("which", ["package", "saved"])
def test_backend_counts_equal_the_family_tokenizer(which, saved_folder):
    folder = minilm_path() if which == "package" else str(saved_folder / "tokenizer")
    light = backend_tokenizer(folder, _family_tokenizer_loaded)
    assert light is not None
    real = load_tokenizer("minilm")
    fast = LengthTokenizer(light)
    assert fast.fast
    texts = [t for t in _texts() if "\x0b" not in t and "\x0c" not in t]  # those go to the real tokenizer
    for special in (True, False):
        assert fast.counts(texts, special) == [len(ids) for ids in real(texts, add_special_tokens=special)["input_ids"]]
    assert light.encode(texts[5]) == real.encode(texts[5])
    assert light._full is None  # none of it needed transformers
    import copy

    assert copy.copy(light)._full is None  # copying it does not load the family's tokenizer either


def test_rows_the_backend_cannot_count_go_to_the_family_tokenizer():
    real = load_tokenizer("minilm")
    light = backend_tokenizer(minilm_path(), lambda: real)
    texts = ["a\x0bb c", "x\x0cy"]
    assert LengthTokenizer(light).counts(texts) == [len(ids) for ids in real(texts)["input_ids"]]
    assert light._full is real


@pytest.mark.parametrize("change", ["lowercase_off", "added_tokens_file", "extra_special", "unknown_key", "not_bert",
                                    "never_split"])
def test_folders_it_cannot_vouch_for_are_refused(change, saved_folder, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(saved_folder / "tokenizer", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if change == "lowercase_off":  # transformers would rebuild the normalizer
        config["do_lower_case"] = False
    elif change == "added_tokens_file":
        (folder / "added_tokens.json").write_text(json.dumps({"<new>": 30522}))
    elif change == "extra_special":  # a special token the file does not hold: transformers adds it
        config["additional_special_tokens"] = ["<extra>"]
    elif change == "unknown_key":
        config["split_special_tokens"] = True
    elif change == "never_split":
        config["never_split"] = ["don't"]
    else:
        config["tokenizer_class"] = "T5Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert backend_tokenizer(str(folder), _family_tokenizer_loaded) is None
    assert backend_tokenizer(str(saved_folder / "tokenizer"), _family_tokenizer_loaded) is not None


def _sana_cfg(tmp_path, data, folder, *extra):
    return compose_cfg(["model=sana", f"model.path={folder}", f"dataset.path={data}", f"output_dir={tmp_path / 'out'}",
                        "sampling.height=64", "sampling.width=64", "plan.unit_items=60", *extra])


@pytest.mark.parametrize("preset", ["sana", "sana_tiny"])
def test_plan_bytes_equal_the_family_tokenizers_plan(preset, saved_folder, tmp_path, monkeypatch):
    rng = random.Random(1)
    rows = [{"key": f"k{i}", "prompt": "".join(rng.choice(WORDS) + " " for _ in range(rng.randint(1, 120)))}
            for i in range(150)]
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    if preset == "sana":  # the instruction prefix: the family's text_lengths over LengthTokenizer
        cfg = _sana_cfg(tmp_path, data, saved_folder)
    else:
        cfg = compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", "plan.unit_items=60"])
    family = get_family(cfg.model.family)
    assert isinstance(planning_tokenizer(family, cfg.model).tokenizer, lengths.BackendTokenizer)
    divisor = family.spatial_divisor(cfg.model)
    light = plan_dataset(cfg, divisor, tmp_path / "light")
    monkeypatch.setattr(lengths, "TOKENIZER_FOLDERS", {})  # every family plans with its own tokenizer
    assert not isinstance(planning_tokenizer(family, cfg.model).tokenizer, lengths.BackendTokenizer)
    full = plan_dataset(cfg, divisor, tmp_path / "full")
    assert light.manifest.to_json() == full.manifest.to_json()
    assert len({u.signature.text_bucket for u in light.manifest.units}) >= 2
    for u in light.manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert (tmp_path / "light" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
        assert pq.read_table(tmp_path / "light" / name).num_rows == u.count

