"""The planner (jobs/plan/): exact token counts, deterministic signature-pure units, whole-file key checks."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from jobs.dataset import DatasetError
from jobs.models.registry import get_family
from jobs.plan.build import plan_dataset
from jobs.plan.units import read_unit
from jobs.output.layout import unit_name
from tests.helpers import compose_cfg, prompts, write_jsonl


def test_length_tokenizer_counts_equal_the_real_tokenizer():
    from jobs.models.text_encoders import load_tokenizer
    from jobs.plan.lengths import LengthTokenizer

    tok = load_tokenizer("minilm")
    fast = LengthTokenizer(tok)
    assert fast.fast
    words = ["red", "Fox", "don't", "4K!", "(octane_render)", "café", "naïve", "東京", "emoji😀", "x" * 101,
             "supercalifragilisticexpialidocious", "a.b,c;d", "UPPER", "12ab34", "\t", "\x01ctl", "--", "~`^|",
             "[MASK]", "[mask]", "x[SEP]y", "[UNK]!", "\x0b", "a\x0cb", "e\u0301", "\u0301", "\u3000", "a\xa0b",
             "ΣΑΣ", "İstanbul", "ﬁne", "\x1c", "\x7f", "123456789", "3.14159", "１２３"]
    rng = random.Random(3)
    seps = [" ", " ", " ", "  ", "\t", "\n", "\r\n", ""]
    texts = ["", " ", "a\tb\nc\r"] + ["".join(rng.choice(words) + rng.choice(seps) for _ in range(rng.randint(1, 30)))
                                      for _ in range(600)]
    for special in (True, False):
        want = [len(ids) for ids in tok(texts, add_special_tokens=special)["input_ids"]]
        assert fast.counts(texts, special) == want
    assert fast.fast_hits > 0 and fast.slow_calls > 0  # both paths ran


def _cfg(tmp_path, data, *extra):
    return compose_cfg([f"dataset.path={data}", f"output_dir={tmp_path / 'out'}", "sampling.height=64",
                        "sampling.width=64", "sampling.steps=2", *extra])


def _plan(cfg, work):
    divisor = get_family(cfg.model.family).spatial_divisor(cfg.model)
    return plan_dataset(cfg, divisor, work)


def _rows(n):
    rows = prompts(n)
    for i, r in enumerate(rows):
        if i % 5 == 0:
            r["width"] = 128  # a second signature, interleaved with the first
        if i % 7 == 0:
            r["prompt"] = " ".join(["long"] * 70)  # a third: text bucket 128
    return rows


def _units(work, manifest):
    return [(u.signature, [it.key for it in read_unit(work, u, "x", "float32")]) for u in manifest.units]


def test_units_are_signature_pure_equal_in_dataset_order_and_cover_every_row_once(tmp_path):
    rows = _rows(100)
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    result = _plan(_cfg(tmp_path, data, "plan.unit_items=7"), tmp_path / "w")
    m = result.manifest
    units = _units(tmp_path / "w", m)
    keys = [k for _, ks in units for k in ks]
    assert sorted(keys) == sorted(r["key"] for r in rows) and len(keys) == len(set(keys))
    order = {r["key"]: i for i, r in enumerate(rows)}
    by_sig = {}
    for sig, ks in units:
        by_sig.setdefault(sig, []).append(len(ks))
        assert [order[k] for k in ks] == sorted(order[k] for k in ks)  # dataset order inside a unit
    assert len(by_sig) == 4 and list(by_sig) == sorted(by_sig)  # 2 sizes x 2 text buckets, in signature order
    for sizes in by_sig.values():
        assert max(sizes) <= 7 and max(sizes) - min(sizes) <= 1  # equal units, no stub tail
    assert [u.id for u in m.units] == list(range(len(m.units)))
    assert all(u.cost == pytest.approx(u.count * u.signature.height * u.signature.width * 2 * 2 / 1e6)
               for u in m.units)
    cols = pq.read_table(tmp_path / "w" / f"{unit_name(0)}.parquet").column_names
    assert {"key", "prompt", "seed", "height", "width", "cost"} <= set(cols)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_plan_is_the_same_for_any_number_of_processes_and_chunk_size(tmp_path, monkeypatch, start):
    import jobs.plan.build as build

    if start not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {start} here")
    monkeypatch.setattr(build, "_start_method", lambda: start)  # fork where safe (the CLI), else spawn
    rows = _rows(300)
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    one = _plan(_cfg(tmp_path, data, "plan.unit_items=40", "plan.workers=1"), tmp_path / "a")
    many = _plan(_cfg(tmp_path, data, "plan.unit_items=40", "plan.workers=2", "plan.chunk_mb=0.002"), tmp_path / "b")
    assert one.manifest.to_json() == many.manifest.to_json()
    for u in one.manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert pq.read_table(tmp_path / "a" / name).equals(pq.read_table(tmp_path / "b" / name))


def test_a_chunk_the_fast_lane_declines_midway_replans_row_by_row_with_a_pool(tmp_path):
    """Chunks ahead of the declined one are still in the pool when the planner starts over row by
    row: they must end before the spill is cleared (else their files would mix into the new plan)."""
    path = tmp_path / "p.jsonl"
    lines = [json.dumps(r) for r in _rows(400)]
    lines[250] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    args = ("plan.unit_items=30", "dataset.on_error=skip", "plan.chunk_mb=0.002")
    one = _plan(_cfg(tmp_path, path, *args, "plan.workers=1"), tmp_path / "a")
    two = _plan(_cfg(tmp_path, path, *args, "plan.workers=2"), tmp_path / "b")
    assert one.manifest.to_json() == two.manifest.to_json() and [e.line for e in two.errors] == [251]
    for u in one.manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert pq.read_table(tmp_path / "a" / name).equals(pq.read_table(tmp_path / "b" / name))


def test_duplicate_keys_are_found_across_chunks(tmp_path):
    rows = prompts(60)
    rows[50]["key"] = rows[3]["key"]
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(DatasetError, match=r"p.jsonl:51: duplicate key 'k003' \(first at .*p.jsonl:4\)"):
        _plan(_cfg(tmp_path, data, "plan.workers=1", "plan.chunk_mb=0.001"), tmp_path / "a")
    kept = _plan(_cfg(tmp_path, data, "plan.workers=1", "plan.chunk_mb=0.001", "dataset.on_error=skip"),
                 tmp_path / "b")
    assert kept.manifest.n_items == 59 and [e.line for e in kept.errors] == [51]
    items = [it for u in kept.manifest.units for it in read_unit(tmp_path / "b", u, "p", "float32")]
    assert [it.source for it in items if it.key == "k003"] == ["p:4"]  # the first holder wins


def test_bad_rows_and_limit(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [json.dumps(r) for r in prompts(10)]
    lines[2] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="p.jsonl:3: malformed JSON"):
        _plan(_cfg(tmp_path, path), tmp_path / "a")
    res = _plan(_cfg(tmp_path, path, "dataset.on_error=skip", "dataset.limit=4"), tmp_path / "b")
    keys = sorted(it.key for u in res.manifest.units for it in read_unit(tmp_path / "b", u, "p", "float32"))
    assert keys == ["k000", "k001", "k003", "k004"] and res.manifest.dataset["bad_rows"] == 1


def test_arrow_fast_lane_plans_exactly_as_the_row_by_row_path(tmp_path, monkeypatch):
    rows = _rows(120)
    for i, r in enumerate(rows):
        if i % 3 == 0:
            r["seed"] = i * 1000
        if i % 4 == 0:
            r["guidance_scale"] = 1 if i % 8 else 7.5
        if i % 6 == 0:
            r["negative_prompt"] = "blurry, (low quality)"
        if i % 11 == 0:
            del r["key"]  # derived from file and line
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = _cfg(tmp_path, data, "plan.unit_items=9", "plan.workers=1")
    fast = _plan(cfg, tmp_path / "fast")
    import jobs.plan.fast_jsonl as lane

    calls = []
    monkeypatch.setattr(lane, "arrow_rows", lambda *a: calls.append(1))  # returns None: the row-by-row path
    slow = _plan(cfg, tmp_path / "slow")
    assert calls and fast.manifest.to_json() == slow.manifest.to_json()
    for u in fast.manifest.units:
        name = f"{unit_name(u.id)}.parquet"
        assert pq.read_table(tmp_path / "fast" / name).equals(pq.read_table(tmp_path / "slow" / name))


@pytest.mark.parametrize("line", ['{"prompt": "x", "width": 100}', '{"prompt": "x", "seed": 1.5}',
                                  '{"prompt": 3}', '"a bare string prompt"', '{"prompt": "x", "extra": 1}',
                                  '{"prompt": "x", "key": ""}', '{"prompt": "\\ud800"}', '', '{"prompt": "x"}\r',
                                  '{"prompt": "%s"}' % ("x" * 200)])
def test_arrow_fast_lane_declines_what_it_cannot_vouch_for(line):
    from jobs.plan.fast_jsonl import arrow_rows

    good = '{"key": "a", "prompt": "fine"}'
    assert arrow_rows(f"{good}\n".encode(), 1, "p", "prompt", "key", 100) is not None
    assert arrow_rows(f"{good}\n{line}\n{good.replace('a', 'b')}\n".encode(), 1, "p", "prompt", "key", 100) is None
    assert arrow_rows(b"\xef\xbb\xbf" + f"{good}\n".encode(), 1, "p", "prompt", "key", 100) is None  # a BOM


def test_sana_text_length_arrays_equal_text_lengths():
    """The planner's columnar form of SANA's rule (lower, strip, count; truncation at
    max_sequence_length) gives what text_lengths gives, prompt for prompt."""
    import pyarrow as pa

    from jobs.models.text_encoders import load_tokenizer
    from jobs.plan.lengths import LengthTokenizer

    cfg = compose_cfg(["output_dir=/tmp/x", "model.max_sequence_length=40"])
    family = get_family(cfg.model.family)
    tok = LengthTokenizer(load_tokenizer("minilm"))
    rng = random.Random(5)
    words = ["Red", "FOX", "naïve", "İstanbul", "\x1c", "\x0b", "\u3000", "[MASK]", "a,b", "x" * 30, "\t", "ΣΣ"]
    texts = ["", " \x1f\x0c padded \r\n"] + ["".join(rng.choice(words) + rng.choice(" \n") for _ in range(rng.randint(0, 60)))
                                           for _ in range(300)]
    for instruction in (True, False):
        want = family.text_lengths(tok.tokenizer, texts, cfg.model, instruction)  # the real tokenizer
        used, raw, limit = family.text_length_arrays(tok, pa.array(texts), cfg.model, instruction)
        assert [(t.used, t.raw, t.limit) for t in want] == list(zip(used.tolist(), raw.tolist(), limit.tolist()))
    assert any(t.raw > t.limit for t in want)  # truncation was exercised


def test_no_more_processes_start_than_there_are_chunks(tmp_path, caplog):
    import logging

    data = write_jsonl(tmp_path / "p.jsonl", _rows(300))
    chunk_mb = data.stat().st_size / 2.5 / (1 << 20)  # the file is three chunks
    with caplog.at_level(logging.INFO, logger="jobs.plan"):
        _plan(_cfg(tmp_path, data, "plan.workers=8", f"plan.chunk_mb={chunk_mb}"), tmp_path / "w")
    assert "planning in 3 processes" in caplog.text
