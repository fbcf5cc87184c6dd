"""Each dataset format parses into the same records: JSONL, TXT, CSV, Parquet, webdataset tar."""

import io
import json
import os
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset

from jobs.dataset import DatasetConfig, DatasetError, Record, load_dataset


def load(path, **kw):
    return load_dataset(DatasetConfig(path=str(path), **kw))


def test_jsonl_objects_bare_strings_and_blank_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"key": "a", "prompt": "a cat", "negative_prompt": "blur", "seed": 7, "width": 512,'
        ' "height": 768, "steps": 20, "guidance_scale": 4.5}\n'
        "\n"
        '"a bare string is a prompt"\n'
        '   \n'
        '{"prompt": "", "guidance_scale": 3}\n', encoding="utf-8")
    result = load(path)
    assert result.format == "jsonl" and result.path == str(path) and result.errors == []
    assert result.records == [
        Record("a", "a cat", "blur", 7, 512, 768, 20, 4.5, source=f"{path}:1"),
        Record("p-000003", "a bare string is a prompt", source=f"{path}:3"),
        Record("p-000005", "", guidance_scale=3.0, source=f"{path}:5"),
    ]
    assert type(result.records[2].guidance_scale) is float


def test_jsonl_utf8_bom_and_crlf(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9"}\r\n{"prompt": "b"}\r\n')
    assert [r.prompt for r in load(path).records] == ["café", "b"]


def test_txt_one_prompt_a_line(tmp_path):
    path = tmp_path / "list.txt"
    path.write_bytes(b"\xef\xbb\xbfa red fox\r\n\n  \nsnow \xe2\x9d\x84\nlast line, no newline")
    records = load(path).records
    assert [(r.key, r.prompt) for r in records] == [
        ("list-000001", "a red fox"), ("list-000004", "snow ❄"), ("list-000005", "last line, no newline")]


def test_csv_header_quotes_multiline_and_empty_cells(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(
        "key,prompt,seed,guidance_scale,notes\n"
        'k1,"a fox, in snow",42,4.5,ignored\n'
        '\n'
        ',"a prompt over\ntwo lines",,,\n'
        'k3,"",,,\n', encoding="utf-8")
    records = load(path).records
    assert records == [
        Record("k1", "a fox, in snow", seed=42, guidance_scale=4.5, source=f"{path}:2"),
        # The quoted field spans lines 4-5: the row is where it starts; its key derives from it.
        Record("rows-000004", "a prompt over\ntwo lines", source=f"{path}:4"),
        Record("k3", "", source=f"{path}:6"),
    ]


def test_csv_without_prompt_column_names_the_columns(tmp_path):
    path = tmp_path / "nohead.csv"
    path.write_text("caption,url\na cat,http://x\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load(path)
    message = str(info.value)
    assert f"{path}:1: the CSV header has no column 'prompt' (columns found: 'caption', 'url')" in message
    assert "dataset.prompt_field" in message and "dataset.format=txt" in message
    # ... and the fix it names works.
    assert load(path, prompt_field="caption").records[0].prompt == "a cat"


def test_parquet_rows_nulls_and_unused_columns(tmp_path):
    path = tmp_path / "set.parquet"
    table = pa.table({
        "key": ["a", None, "c"],
        "prompt": ["one", "two", ""],
        "seed": pa.array([1, None, 3], pa.int64()),
        "steps": pa.array([None, 30, None], pa.int32()),
        "guidance_scale": [None, 2.5, None],
        "image": pa.array([b"\x89PNG" * 100] * 3),  # never read: only known columns are
    })
    pq.write_table(table, path, row_group_size=2)  # two row groups: line numbers run across them
    assert load(path).records == [
        Record("a", "one", seed=1, source=f"{path}:1"),
        Record("set-000002", "two", steps=30, guidance_scale=2.5, source=f"{path}:2"),
        Record("c", "", seed=3, source=f"{path}:3"),
    ]


def test_parquet_non_string_key_column_is_one_clear_error(tmp_path):
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"key": [1, 2], "prompt": ["a", "b"]}), path)
    with pytest.raises(DatasetError, match=r"column 'key' has type int64, expected string; cast it"):
        load(path)


def test_parquet_binary_prompt_with_bad_utf8_is_a_row_error(tmp_path):
    path = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"prompt": pa.array([b"ok", b"bad \xff byte"], pa.binary())}), path)
    result = load(path, on_error="skip")
    assert [r.prompt for r in result.records] == ["ok"]
    assert [str(e) for e in result.errors] == [
        f"{path}:2: undecodable bytes in column 'prompt': not UTF-8 at byte offset 4 (b'\\xff by'); "
        f"re-encode the file as UTF-8"]


def _wds(path, samples):
    with webdataset.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)


def test_webdataset_captions_with_optional_json(tmp_path):
    path = tmp_path / "shard.tar"
    _wds(path, [
        {"__key__": "s1", "txt": "a lighthouse\n", "json": {"seed": 5, "width": 256}, "jpg": b"\xff\xd8"},
        {"__key__": "dir/s2", "txt": "a fox"},
    ])
    records = load(path).records
    # line = index of the sample's first member: s1 has 3 members, so dir/s2 starts at 4.
    assert records == [
        Record("s1", "a lighthouse", seed=5, width=256, source=f"{path}:1"),
        Record("dir/s2", "a fox", source=f"{path}:4"),
    ]


def test_webdataset_bad_samples_are_row_errors(tmp_path):
    path = tmp_path / "bad.tar"
    _wds(path, [
        {"__key__": "noc", "jpg": b"\xff\xd8"},
        {"__key__": "badjson", "txt": "x", "json": b"{nope"},
        {"__key__": "bytes", "txt": b"\xc3\x28"},
        {"__key__": "list", "txt": "x", "json": b"[1]"},
        {"__key__": "good", "txt": "fine"},
    ])
    result = load(path, on_error="skip")
    assert [r.key for r in result.records] == ["good"]
    assert [str(e) for e in result.errors] == [
        f"{path}:1: sample 'noc' has no .txt caption (members: noc.jpg)",
        f"{path}:2: malformed JSON in badjson.json: Expecting property name enclosed in double "
        f"quotes: line 1 column 2 (char 1)",
        f"{path}:4: undecodable bytes in bytes.txt: not UTF-8 at byte offset 0 (b'\\xc3('); "
        f"re-encode the file as UTF-8",
        f"{path}:5: list.json must hold a JSON object, got a JSON array",
    ]
    assert [e.key for e in result.errors] == ["noc", "badjson", "bytes", "list"]


def test_truncated_tar_is_a_file_error(tmp_path):
    path = tmp_path / "cut.tar"
    _wds(path, [{"__key__": f"s{i}", "txt": "x" * 2000} for i in range(4)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"the tar is truncated or corrupt after member"):
        load(path)


def test_format_by_extension_or_explicit(tmp_path):
    path = tmp_path / "prompts.data"
    path.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load(path)
    assert "cannot tell the format from the extension; set dataset.format to one of " \
           "jsonl, txt, csv, parquet, wds" in str(info.value)
    assert [r.prompt for r in load(path, format="txt").records] == ["a", "b"]
    tgz = tmp_path / "caps.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        info = tarfile.TarInfo("k.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"cat"))
    result = load(tgz)
    assert result.format == "wds" and result.records[0].prompt == "cat"


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(DatasetError) as info:
        load(tmp_path / "nope.jsonl")
    assert f"dataset.path='{tmp_path / 'nope.jsonl'}': no such file" in str(info.value)
    # A directory is a list of prompt files (tests/test_dataset_inputs.py); an empty one is an error.
    with pytest.raises(DatasetError, match=r"is a directory with no files; point dataset.path at"):
        load(tmp_path, format="jsonl")


def test_unreadable_file_names_path_and_key(tmp_path):
    # /proc/self/mem exists but every read of its first page fails (EIO), even for root.
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("needs Linux /proc")
    with pytest.raises(DatasetError) as info:
        load_dataset(DatasetConfig(path="/proc/self/mem", format="txt"))
    assert "dataset.path='/proc/self/mem': cannot read it: Input/output error" in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied(tmp_path):
    path = tmp_path / "secret.jsonl"
    path.write_text('"a"\n', encoding="utf-8")
    path.chmod(0)
    with pytest.raises(DatasetError, match=r"dataset.path=.*secret.jsonl': cannot read it: Permission denied"):
        load(path)


def test_readers_agree_across_formats(tmp_path):
    rows = [{"key": "a", "prompt": "one", "seed": 3}, {"key": "b", "prompt": "two"}]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "x.csv").write_text("key,prompt,seed\na,one,3\nb,two,\n", encoding="utf-8")
    pq.write_table(pa.table({"key": ["a", "b"], "prompt": ["one", "two"], "seed": [3, None]}),
                   tmp_path / "x.parquet")
    _wds(tmp_path / "x.tar", [{"__key__": "a", "txt": "one", "json": {"seed": 3}},
                              {"__key__": "b", "txt": "two"}])
    fields = lambda name: [(r.key, r.prompt, r.seed) for r in load(tmp_path / name).records]
    expected = [("a", "one", 3), ("b", "two", None)]
    for name in ("x.jsonl", "x.csv", "x.parquet", "x.tar"):
        assert fields(name) == expected, name


def test_csv_and_parquet_keep_fields_and_name_unknown_columns_as_jsonl_does(tmp_path, caplog):
    """dataset.keep_fields reached each sample from JSONL only: CSV and Parquet readers dropped every column the
    job does not read, silently (Parquet) or at INFO (CSV), and a `guidance` column got no did-you-mean."""
    csv_path = tmp_path / "keep.csv"
    csv_path.write_text("key,prompt,url,guidance\nk1,a red circle,http://x/1,7.5\nk2,a star,,\n")
    pq_path = tmp_path / "keep.parquet"
    pq.write_table(pa.table({"key": ["p1"], "prompt": ["a star"], "url": ["http://x/2"], "score": [0.5],
                             "tags": [["a", "b"]], "guidance": [7.5], "image": [b"\x89PNG" * 10]}), pq_path)
    with caplog.at_level("WARNING"):
        from_csv = load(csv_path, keep_fields=["url"]).records
        from_pq = load(pq_path, keep_fields=["url", "score", "tags"]).records
    assert [(r.key, r.extra and json.loads(r.extra)) for r in from_csv] == [("k1", {"url": "http://x/1"}), ("k2", None)]
    assert json.loads(from_pq[0].extra) == {"url": "http://x/2", "score": 0.5, "tags": ["a", "b"]}
    warned = [r.getMessage() for r in caplog.records]
    assert any(f"{csv_path}" in m and "'guidance' (did you mean 'guidance_scale'?)" in m for m in warned), warned
    assert any(f"{pq_path}" in m and "'guidance' (did you mean 'guidance_scale'?)" in m for m in warned), warned
    caplog.clear()
    with caplog.at_level("WARNING"):
        load(pq_path)
    (unkept,) = [r.getMessage() for r in caplog.records]
    assert all(f"'{name}'" in unkept for name in ("url", "score", "guidance")), unkept  # scalar columns: named
    assert "'image'" not in unkept and "'tags'" not in unkept  # an image, an embedding: never read unless kept
    with pytest.raises(DatasetError, match=r"keep.parquet:1: undecodable bytes in column 'image': not UTF-8"):
        load(pq_path, keep_fields=["image"])  # a kept binary column is read as text, as a caption would be


def test_a_tar_whose_samples_are_scattered_by_extension_is_refused_with_how_to_make_it(tmp_path):
    """`tar cf x.tar *.txt *.json` puts every caption before every json: webdataset reads each run of one key
    as a sample, so each caption lost its json (its seed, size) and each json was "a sample with no caption".
    The tar is refused naming a scattered sample, and the sorted tar the fix makes reads whole."""
    folder = tmp_path / "samples"
    folder.mkdir()
    for k, seed in (("a", 1), ("b", 2)):
        (folder / f"{k}.txt").write_text(f"prompt {k}")
        (folder / f"{k}.json").write_text(json.dumps({"seed": seed}))
    scattered, sorted_tar = tmp_path / "scattered.tar", tmp_path / "sorted.tar"
    with tarfile.open(scattered, "w") as tar:
        for name in ("a.txt", "b.txt", "a.json", "b.json"):  # the shell's *.txt *.json
            tar.add(folder / name, arcname=name)
    with pytest.raises(DatasetError, match=r"the members of sample 'a' do not follow each other \(its \.txt is "
                                           r"member 1, a\.json is member 3\).*Make the tar with its names sorted"):
        load(scattered, on_error="skip")
    with tarfile.open(sorted_tar, "w") as tar:
        for name in sorted(os.listdir(folder)):  # what the message's `ls | sort | tar cf x.tar -T -` gives
            tar.add(folder / name, arcname=name)
    assert [(r.key, r.prompt, r.seed) for r in load(sorted_tar).records] == [("a", "prompt a", 1), ("b", "prompt b", 2)]
    assert [s["__key__"] for s in webdataset.WebDataset(str(sorted_tar), shardshuffle=False)] == ["a", "b"]
