"""Bad rows: each case gives its `file:line: reason`; fail lists them (capped), skip keeps the rest."""

import json

import pytest

from jobs.dataset import DatasetConfig, DatasetError, RowError, load_dataset, write_error_ledger

# (JSONL line, expected reason). Every line is one row, so the line number is its position + 1.
BAD_ROWS = [
    ('{"prompt": "ok", "seed": 1', "malformed JSON: Expecting ',' delimiter (column 27)"),
    ('{"prompt": "ok" "seed": 1}', "malformed JSON: Expecting ',' delimiter (column 17)"),
    ('[1, 2]', "expected a JSON object or a string, got a JSON array"),
    ('42', "expected a JSON object or a string, got a JSON number"),
    ('{"key": "m", "caption": "x"}',
     "missing field 'prompt' (this row has: caption, key); "
     "set dataset.prompt_field if the prompt is under another name"),
    ('{"prompt": null}', 'prompt must be a string, got null (an empty string "" means unconditional)'),
    ('{"prompt": 5}', "prompt must be a string, got int 5"),
    ('{"prompt": ["a"]}', "prompt must be a string, got list ['a']"),
    ('{"prompt": "\\udc80x"}', "prompt holds a lone surrogate (a broken \\uXXXX escape), not valid text"),
    ('{"prompt": "x", "negative_prompt": 3}', "negative_prompt must be a string, got int 3"),
    ('{"prompt": "x", "seed": -1}', "seed must be an integer in [0, 2**63), got -1"),
    ('{"prompt": "x", "seed": 9223372036854775808}',
     "seed must be an integer in [0, 2**63), got 9223372036854775808"),
    ('{"prompt": "x", "seed": 1.5}', "seed must be an integer in [0, 2**63), got float 1.5"),
    ('{"prompt": "x", "seed": true}', "seed must be an integer in [0, 2**63), got bool True"),
    ('{"prompt": "x", "seed": "42"}', "seed must be an integer in [0, 2**63), got str '42'"),
    ('{"prompt": "x", "width": 0}', "width must be an integer multiple of 8 in [8, 8192], got 0"),
    ('{"prompt": "x", "width": 1001}', "width must be an integer multiple of 8 in [8, 8192], got 1001"),
    ('{"prompt": "x", "height": 8200}', "height must be an integer multiple of 8 in [8, 8192], got 8200"),
    ('{"prompt": "x", "height": -512}', "height must be an integer multiple of 8 in [8, 8192], got -512"),
    ('{"prompt": "x", "height": 512.0}',
     "height must be an integer multiple of 8 in [8, 8192], got float 512.0"),
    ('{"prompt": "x", "steps": 0}', "steps must be an integer in [1, 1000], got 0"),
    ('{"prompt": "x", "steps": 1001}', "steps must be an integer in [1, 1000], got 1001"),
    ('{"prompt": "x", "steps": false}', "steps must be an integer in [1, 1000], got bool False"),
    ('{"prompt": "x", "guidance_scale": -0.5}', "guidance_scale must be a finite number >= 0, got -0.5"),
    ('{"prompt": "x", "guidance_scale": NaN}', "guidance_scale must be a finite number >= 0, got nan"),
    ('{"prompt": "x", "guidance_scale": Infinity}',
     "guidance_scale must be a finite number >= 0, got inf"),
    ('{"prompt": "x", "guidance_scale": "4"}', "guidance_scale must be a finite number >= 0, got str '4'"),
    ('{"prompt": "x", "guidance_scale": true}',
     "guidance_scale must be a finite number >= 0, got bool True"),
    ('{"prompt": "x", "key": ""}',
     "key is empty: give a non-empty key, or leave the field out to derive one"),
    ('{"prompt": "x", "key": 7}', "key must be a non-empty string, got int 7"),
    ('{"prompt": "x", "key": "a\\nb"}', "key 'a\\nb' holds a control character U+000A at index 1"),
    ('{"prompt": "x", "key": "a\\u0085"}', "key 'a\\x85' holds a control character U+0085 at index 1"),
    ('{"prompt": "x", "key": "k\\ud800"}', "key 'k\\ud800' holds a lone surrogate U+D800 at index 1"),
    ('{"prompt": "x", "key": "%s"}' % ("k" * 201), "key is 201 characters long, at most 200 allowed"),
]

GOOD_ROWS = [
    '{"prompt": ""}',  # empty prompt: unconditional generation
    '{"prompt": "x", "seed": 0, "width": 8, "height": 8192, "steps": 1, "guidance_scale": 0}',
    '{"prompt": "x", "seed": 9223372036854775807, "steps": 1000, "guidance_scale": 7, "key": "%s"}'
    % ("k" * 200),
    '{"prompt": "x", "key": "dots.and/slashes ../ é 🦊", "negative_prompt": null, "seed": null}',
]


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def load(path, **kw):
    return load_dataset(DatasetConfig(path=str(path), **kw))


def test_every_bad_row_case_gives_its_reason(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [line for line, _ in BAD_ROWS] + GOOD_ROWS)
    result = load(path, on_error="skip")
    assert [str(e) for e in result.errors] == [
        f"{path}:{n}: {reason}" for n, (_, reason) in enumerate(BAD_ROWS, 1)]
    assert len(result.records) == len(GOOD_ROWS)
    assert result.records[0].prompt == "" and result.records[3].key == "dots.and/slashes ../ é 🦊"


def test_undecodable_bytes_are_a_row_error_in_jsonl_txt_and_csv(tmp_path):
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    txt = tmp_path / "b.txt"
    txt.write_bytes(b"ok\ncaf\xe9\n")
    csv = tmp_path / "b.csv"
    csv.write_bytes(b"prompt,key\nok,a\ncaf\xe9,b\n")
    reasons = {
        jsonl: "undecodable bytes: not UTF-8 at byte offset 15 (b'\\xe9\"}'); re-encode the file as UTF-8",
        txt: "undecodable bytes: not UTF-8 at byte offset 3 (b'\\xe9'); re-encode the file as UTF-8",
        csv: "undecodable bytes in column 'prompt': not UTF-8; re-encode the file as UTF-8",
    }
    for path, reason in reasons.items():
        result = load(path, on_error="skip")
        assert [r.prompt for r in result.records] == ["ok"]
        assert [str(e) for e in result.errors] == [f"{path}:{3 if path == csv else 2}: {reason}"]


def test_csv_row_cases(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text(
        "prompt,seed,width,guidance_scale\n"
        "a,1,512,4.5\n"
        "b,x,,\n"
        "c,,513,\n"
        "d,,,nan\n"
        "e,1,2,3,4\n"
        '"f" x,1,,\n', encoding="utf-8")
    result = load(path, on_error="skip")
    assert [r.prompt for r in result.records] == ["a"]
    assert [str(e) for e in result.errors] == [
        f"{path}:3: seed must be an integer in [0, 2**63), got str 'x'",
        f"{path}:4: width must be an integer multiple of 8 in [8, 8192], got 513",
        f"{path}:5: guidance_scale must be a finite number >= 0, got nan",
        f"{path}:6: the row has 5 cells but the header has 4: quote fields that hold commas",
        f"{path}:7: malformed CSV: ',' expected after '\"'",
    ]


def test_fail_lists_rows_caps_at_20_and_gives_the_total(tmp_path):
    lines = ['{"prompt": "good"}'] + ['{"prompt": 1}'] * 25 + ['{"prompt": "good too"}']
    path = write_jsonl(tmp_path / "many.jsonl", lines)
    with pytest.raises(DatasetError) as info:
        load(path)
    message = str(info.value)
    assert message.splitlines() == [
        f"dataset.path='{path}': 25 bad rows:",
        *[f"  {path}:{n}: prompt must be a string, got int 1" for n in range(2, 22)],
        "  ... and 5 more (25 bad rows in total)",
        "Fix these rows, or set dataset.on_error=skip to generate the 2 good rows and write the "
        "bad ones to errors.jsonl in output_dir.",
    ]
    assert isinstance(info.value, ValueError) and len(info.value.errors) == 25


def test_skip_returns_good_rows_and_every_error(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", ['"a"', "{", '"b"', '{"prompt": "c", "steps": 0}'])
    result = load(path, on_error="skip")
    assert [(r.key, r.prompt) for r in result.records] == [("mixed-000001", "a"), ("mixed-000003", "b")]
    assert [(e.line, e.reason[:14]) for e in result.errors] == [(2, "malformed JSON"), (4, "steps must be ")]


def test_duplicate_keys_name_both_locations(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        '{"key": "x", "prompt": "1"}', '{"key": "y", "prompt": "2"}', '{"key": "x", "prompt": "3"}',
        '{"key": "x", "prompt": "4"}'])
    result = load(path, on_error="skip")
    assert [r.prompt for r in result.records] == ["1", "2"]
    assert [str(e) for e in result.errors] == [
        f"{path}:3: duplicate key 'x' (first at {path}:1)",
        f"{path}:4: duplicate key 'x' (first at {path}:1)"]
    assert [e.key for e in result.errors] == ["x", "x"]


def test_derived_keys_never_collide_with_given_keys(tmp_path):
    # Both orders: keyless line 1 derives d-000001 before line 2 gives it; line 3 gives
    # d-000004 before keyless line 4 derives it. The later row is the bad one.
    path = write_jsonl(tmp_path / "d.jsonl", [
        '"keyless"', '{"key": "d-000001", "prompt": "given later"}',
        '{"key": "d-000004", "prompt": "given first"}', '"keyless too"'])
    result = load(path, on_error="skip")
    assert [r.prompt for r in result.records] == ["keyless", "given first"]
    assert [str(e) for e in result.errors] == [
        f"{path}:2: key 'd-000001' equals the key derived for the keyless row at {path}:1: "
        f"rename this key or give that row a key",
        f"{path}:4: the key derived for this keyless row, 'd-000004', is already the given key "
        f"at {path}:3: give this row a key",
    ]


def test_derived_keys_are_stable_across_loads_and_depend_on_line(tmp_path):
    path = write_jsonl(tmp_path / "stable.jsonl", ['"a"', "", '"b"', '{"prompt": "c", "key": "k"}'])
    first = [(r.key, r.prompt) for r in load(path).records]
    second = [(r.key, r.prompt) for r in load(path).records]
    assert first == second == [("stable-000001", "a"), ("stable-000003", "b"), ("k", "c")]


def test_limit_takes_first_valid_rows_but_validates_everything(tmp_path):
    path = write_jsonl(tmp_path / "l.jsonl", ['{"prompt": 1}', '"a"', '"b"', '"c"', '{"prompt": 2}'])
    result = load(path, on_error="skip", limit=2)
    assert [r.prompt for r in result.records] == ["a", "b"]
    assert [e.line for e in result.errors] == [1, 5]  # the row after the limit is still checked
    with pytest.raises(DatasetError, match="2 bad rows"):
        load(path, limit=2)


def test_empty_and_all_bad_files(tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DatasetError, match=r"empty.jsonl' holds no prompts"):
        load(empty, on_error="skip")
    bad = write_jsonl(tmp_path / "allbad.jsonl", ["{", "["])
    with pytest.raises(DatasetError) as info:
        load(bad, on_error="skip")
    assert "2 bad rows" in str(info.value) and "Every row is bad" in str(info.value)


def test_prompt_and_key_fields_are_configurable(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ['{"id": "a", "caption": "x", "prompt": "ignored"}'])
    record = load(path, prompt_field="caption", key_field="id").records[0]
    assert (record.key, record.prompt) == ("a", "x")


def test_rows_are_data_never_evaluated(tmp_path):
    payload = "__import__('os').system('touch pwned')"
    path = write_jsonl(tmp_path / "e.jsonl", [json.dumps({"prompt": payload, "key": payload})])
    assert load(path).records[0].prompt == payload
    assert not (tmp_path / "pwned").exists()


def test_error_ledger_appends_json_lines(tmp_path):
    ledger = tmp_path / "out" / "errors.jsonl"
    errors = [RowError("p.jsonl", 3, None, "malformed JSON"), RowError("p.jsonl", 9, "k\ud800", "bad key")]
    write_error_ledger(ledger, errors[:1])
    write_error_ledger(ledger, errors[1:])
    rows = [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]
    assert rows == [{"file": "p.jsonl", "line": 3, "key": None, "reason": "malformed JSON"},
                    {"file": "p.jsonl", "line": 9, "key": "k\ud800", "reason": "bad key"}]
    assert str(errors[0]) == "p.jsonl:3: malformed JSON"


@pytest.mark.parametrize("field, value, expected", [
    ("format", "yaml", "dataset.format='yaml' is not a dataset format; "
                       "allowed: auto, jsonl, txt, csv, parquet, wds"),
    ("on_error", "ignore", "dataset.on_error='ignore' is not allowed; allowed: fail, skip"),
    ("limit", -1, "dataset.limit=-1 must be an integer >= 0 (0 = all rows)"),
    ("prompt_field", "", "dataset.prompt_field is empty"),
    ("key_field", "prompt", "dataset.prompt_field and dataset.key_field are both 'prompt'"),
])
def test_config_rejects_bad_values(field, value, expected):
    with pytest.raises(ValueError) as info:
        DatasetConfig(**{field: value})
    assert expected in str(info.value)


def test_kept_fields_must_be_strict_json_text(tmp_path):
    """A kept NaN passed the plan and failed each sample's json after the model's load, on every rerun; a kept
    lone surrogate failed the planner with a traceback. Both are bad rows, named by file:line."""
    path = write_jsonl(tmp_path / "kept.jsonl", [
        '{"key": "nan", "prompt": "x", "score": NaN}',
        '{"key": "inf", "prompt": "x", "score": {"max": -Infinity}}',
        '{"key": "sur", "prompt": "x", "url": "\\ud800x"}',
        '{"key": "ok", "prompt": "x", "score": 1.5, "url": "http://e/é"}',
        '{"key": "dropped", "prompt": "x", "other": NaN}'])  # not kept: never written
    result = load(path, on_error="skip", keep_fields=["url", "score"])
    assert [str(e) for e in result.errors] == [
        f"{path}:1: dataset.keep_fields: 'score' holds float nan: JSON has no NaN or Infinity (Python's json "
        f"writes them); write null, a number or a string",
        f"{path}:2: dataset.keep_fields: 'score' holds dict {{'max': -inf}}: JSON has no NaN or Infinity "
        f"(Python's json writes them); write null, a number or a string",
        f"{path}:3: dataset.keep_fields: 'url' holds a lone surrogate (a broken \\uXXXX escape), not valid text"]
    assert [r.key for r in result.records] == ["ok", "dropped"]
    assert json.loads(result.records[0].extra) == {"url": "http://e/é", "score": 1.5}


def test_a_re_plan_rewrites_the_bad_rows_and_keeps_the_nan_images_entries(tmp_path):
    """job.extend deleted errors.jsonl and wrote the new plan's bad rows: the NaN/Inf images the run had found
    (job.on_nonfinite=ledger) were then in no shard and no ledger."""
    from jobs.dataset import NONFINITE_REASON, rewrite_error_ledger

    ledger = tmp_path / "errors.jsonl"
    write_error_ledger(ledger, [RowError("p.jsonl", 3, None, "malformed JSON: ..."),
                                RowError("p.jsonl", 1, "nan1", NONFINITE_REASON)])
    with open(ledger, "a", encoding="utf-8") as f:
        f.write('{"file": "p.jsonl", "li')  # a torn last line (a kill mid-append): nothing to keep of it
    rewrite_error_ledger(ledger, [RowError("p.jsonl", 3, None, "malformed JSON: ..."),
                                  RowError("p.jsonl", 9, None, "seed must be ...")])
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(r["line"], r["key"], r["reason"]) for r in rows] == [
        (3, None, "malformed JSON: ..."), (9, None, "seed must be ..."), (1, "nan1", NONFINITE_REASON)]
    rewrite_error_ledger(tmp_path / "new.jsonl", [])  # no ledger yet, no bad rows: none written
    assert not (tmp_path / "new.jsonl").exists()
