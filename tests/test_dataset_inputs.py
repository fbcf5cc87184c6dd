"""Every input is bounded: line endings, encodings, line length (even /dev/zero), file lists."""

from __future__ import annotations

import codecs
import json
import os
import threading
import time
import tracemalloc

import pytest

from jobs.dataset import DatasetConfig, DatasetError, load_dataset
from jobs.dataset.formats import read_txt
from jobs.dataset.lines import read_lines


def load(path, **kw):
    return load_dataset(DatasetConfig(path=str(path), **kw))


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_line_ending_ends_a_line(tmp_path, eol):
    txt = tmp_path / "p.txt"
    txt.write_bytes(eol.join([b"a red fox", b"", b"snow", b"last"]))
    assert [(r.key, r.prompt) for r in load(txt).records] == [("p-000001", "a red fox"), ("p-000003", "snow"),
                                                             ("p-000004", "last")]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes(eol.join([b'{"prompt": "one"}', b'{"prompt": "two"}']) + eol)
    assert [r.prompt for r in load(jsonl).records] == ["one", "two"]


def test_cr_then_lf_split_across_read_chunks_is_one_ending(tmp_path, monkeypatch):
    import jobs.dataset.lines as lines

    monkeypatch.setattr(lines, "CHUNK", 4)  # "abc\r" | "\ndef" | "\r\rg": endings across chunk edges
    path = tmp_path / "p.txt"
    path.write_bytes(b"abc\r\ndef\r\rg")
    assert [(n, text) for n, text, _ in read_lines(path)] == [(1, b"abc"), (2, b"def"), (3, b""), (4, b"g")]


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-be", "utf-32", "utf-32-be"])
def test_byte_order_mark_picks_the_encoding(tmp_path, encoding):
    text = '{"key": "k", "prompt": "café ❄"}\n"second"\r\n'
    bom = {"utf-16-be": codecs.BOM_UTF16_BE, "utf-32-be": codecs.BOM_UTF32_BE}.get(encoding, b"")
    path = tmp_path / "p.jsonl"
    path.write_bytes(bom + text.encode(encoding))
    assert [(r.key, r.prompt) for r in load(path).records] == [("k", "café ❄"), ("p-000002", "second")]


def test_invalid_utf16_is_a_file_error_naming_the_encoding(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(codecs.BOM_UTF16_LE + "ok\n".encode("utf-16-le") + b"\x00\xd8" + "x".encode("utf-16-le"))
    with pytest.raises(DatasetError) as e:
        load(path)
    assert f"{path}: the file starts with a UTF-16-LE byte order mark but is not valid UTF-16-LE" in str(e.value)
    assert "re-encode it as UTF-8" in str(e.value)


def test_a_line_longer_than_the_limit_is_a_row_error(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n' + b'{"prompt": "' + b"x" * 5000 + b'"}\n{"prompt": "after"}\n')
    result = load(path, on_error="skip", max_line_bytes=1000)
    assert [r.prompt for r in result.records] == ["ok", "after"]
    assert [str(e) for e in result.errors] == [
        f"{path}:2: line longer than 1000 bytes (dataset.max_line_bytes): is this a text file of prompts? "
        f"Split the line, or raise dataset.max_line_bytes"]
    csv = tmp_path / "p.csv"
    csv.write_bytes(b"prompt\nok\n" + b"y" * 5000 + b"\nafter\n")
    result = load(csv, on_error="skip", max_line_bytes=1000)
    assert [r.prompt for r in result.records] == ["ok", "after"] and [e.line for e in result.errors] == [3]


def test_dev_zero_fails_fast_in_bounded_memory():
    """The reader on an endless line: the first row is the row error, within a second and one
    line's memory (it grew to 5.6 GB before)."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    out = {}

    def first_row():
        tracemalloc.start()
        t0 = time.perf_counter()
        out["row"] = next(read_txt("/dev/zero", "prompt", "key", 1 << 20))
        out["seconds"] = time.perf_counter() - t0
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    reader = threading.Thread(target=first_row, daemon=True)  # a hang fails the test, not the suite
    reader.start()
    reader.join(timeout=30)
    assert "row" in out, "the reader did not yield within 30 s"
    line, bad = out["row"]
    assert line == 1 and bad.reason.startswith("line longer than 1048576 bytes (dataset.max_line_bytes)")
    assert out["seconds"] < 5 and out["peak"] < 8 * (1 << 20), out
    # The job refuses the device before reading it at all.
    with pytest.raises(DatasetError) as e:
        load("/dev/zero", format="txt")
    assert "dataset.path='/dev/zero': /dev/zero is a device, not a file of prompts" in str(e.value)


def test_directory_of_files_in_sorted_order_with_unique_keys(tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "b.jsonl").write_text('{"prompt": "b1"}\n{"key": "x", "prompt": "b2"}\n')
    (folder / "a.txt").write_text("a1\na2\n")
    (folder / ".hidden.jsonl").write_text('{"prompt": "never"}\n')
    (folder / "notes.md").write_text("not a prompt file\n")
    result = load(folder)
    assert [(r.key, r.prompt, r.source) for r in result.records] == [
        ("a-000001", "a1", f"{folder / 'a.txt'}:1"), ("a-000002", "a2", f"{folder / 'a.txt'}:2"),
        ("b-000001", "b1", f"{folder / 'b.jsonl'}:1"), ("x", "b2", f"{folder / 'b.jsonl'}:2")]
    assert load(folder).records == result.records  # stable


def test_brace_list_reads_in_order_and_names_file_and_line(tmp_path):
    for i in range(3):
        rows = [{"key": f"k{i}", "prompt": f"p{i}"}] + ([{"key": "k0", "prompt": "dup"}] if i == 2 else [])
        (tmp_path / f"prompts-{i:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pattern = str(tmp_path / "prompts-{000..002}.jsonl")
    with pytest.raises(DatasetError) as e:
        load(pattern)
    first, dup = tmp_path / "prompts-000.jsonl", tmp_path / "prompts-002.jsonl"
    assert f"{dup}:2: duplicate key 'k0' (first at {first}:1)" in str(e.value)
    result = load(pattern, on_error="skip")
    assert [r.key for r in result.records] == ["k0", "k1", "k2"]
    with pytest.raises(DatasetError) as e:
        load(str(tmp_path / "prompts-{000..004}.jsonl"))
    assert "names 5 files and 2 do not exist" in str(e.value) and "prompts-003.jsonl" in str(e.value)


UNTERMINATED = 'Close the quote (a quote inside a quoted field is written twice: "")'


def test_an_unterminated_csv_quote_is_named_where_it_starts_not_one_bad_row(tmp_path):
    """csv reads an open quote to the end of the file: every row after it vanished into one "malformed CSV" row."""
    from tests.test_resume_kill import cli

    path = tmp_path / "p.csv"
    path.write_text('key,prompt\na,red fox\nb,"blue lake\nc,green hill\nd,old bridge\n', encoding="utf-8")
    for on_error in ("fail", "skip"):
        with pytest.raises(DatasetError) as e:
            load(path, on_error=on_error)
        assert str(e.value) == (f"unterminated quote starting at {path}:3: the quoted field opened there runs to the "
                                f"end of the file (lines 3-5), taking every row after it as its text. {UNTERMINATED}")
    # The planner reads with the same reader: one message, exit 2, before any model (and no traceback).
    plan = cli(f"dataset.path={path}", f"output_dir={tmp_path / 'o'}", module=("-m", "jobs.plan"))
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2 and f"unterminated quote starting at {path}:3" in said and "Traceback" not in said, said
    # On the last line it took no other row: a bad row, the rows before it kept.
    path.write_text('key,prompt\na,red fox\nb,"blue lake\n', encoding="utf-8")
    result = load(path, on_error="skip")
    assert [r.key for r in result.records] == ["a"]
    assert [str(e) for e in result.errors] == [
        f"{path}:3: unterminated quote: the quoted field opened on this line runs to the end of the file. "
        f"{UNTERMINATED}"]


def test_a_csv_quote_that_runs_past_max_line_bytes_is_refused_there_and_the_fix_reads_it(tmp_path):
    # The quote on line 2 is closed by the stray one on line 40: csv took lines 2-40 as one field.
    rows = ['a,"red fox'] + [f"k{i},prompt number {i} " + "x" * 40 for i in range(3, 40)] + ['z,"quoted" x', "y,ok"]
    path = tmp_path / "p.csv"
    path.write_text("key,prompt\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as e:
        load(path, on_error="skip", max_line_bytes=1000)
    assert str(e.value).startswith(f"unterminated quote starting at {path}:2? The quoted field opened there spans "
                                   f"lines 2-")
    assert str(e.value).endswith("and more than dataset.max_line_bytes=1000 bytes, taking the rows after it as its "
                                 f"text. {UNTERMINATED}, or raise dataset.max_line_bytes if the field is that long")
    # Under the limit, csv's own error names the span and the quote it suspects.
    result = load(path, on_error="skip")
    assert [str(e) for e in result.errors] == [
        f"{path}:2: malformed CSV: ',' expected after '\"' (on line 40, in a quoted field opened on line 2: is its "
        f"quote unterminated?)"]
    assert [r.key for r in result.records] == ["y"]


@pytest.mark.parametrize("chunk", [None, 64], ids=["one chunk", "many chunks"])
def test_a_csv_line_too_long_that_leaves_a_quote_open_is_refused_not_its_lines_read_as_rows(tmp_path, monkeypatch,
                                                                                            chunk):
    """Skipped alone, the line's open quote was lost: the lines of its field after it were read as rows, one of
    them as the prompt 'end of quote"'. The line's quotes are counted while it is skipped (`chunk`: a line
    longer than a read is counted across reads too)."""
    from jobs.dataset import lines

    if chunk:
        monkeypatch.setattr(lines, "CHUNK", chunk)
    path = tmp_path / "p.csv"
    path.write_text('prompt\nfirst ok\n"' + "x" * 300 + '\ninside the quote, still\nend of quote"\nthird ok\n')
    with pytest.raises(DatasetError) as e:
        load(path, on_error="skip", max_line_bytes=100)
    assert str(e.value) == (f"{path}:3 is longer than dataset.max_line_bytes=100 bytes and leaves a quote open, so "
                            f"the lines after it cannot be told from its text. {UNTERMINATED}, or raise "
                            f"dataset.max_line_bytes if the line is that long")
    # A long line whose quotes close is one bad row, as before; the rows after it are read.
    path.write_text('prompt\nfirst ok\n"' + "x" * 150 + '""' + "y" * 150 + '"\nthird ok\n')
    result = load(path, on_error="skip", max_line_bytes=100)
    assert [r.prompt for r in result.records] == ["first ok", "third ok"]
    assert [e.line for e in result.errors] == [3] and "longer than 100 bytes" in result.errors[0].reason
    # The fix it names reads the field whole.
    path.write_text('prompt\nfirst ok\n"' + "x" * 300 + '\ninside the quote, still\nend of quote"\nthird ok\n')
    assert [r.prompt[-12:] for r in load(path, max_line_bytes=1000).records] == ["first ok", "end of quote",
                                                                                "third ok"]


def test_a_long_csv_field_is_bounded_by_max_line_bytes_as_other_formats_not_by_csvs_128_kib(tmp_path):
    import csv

    limit = csv.field_size_limit()
    prompt = "a red fox " * 20_000  # 200 kB: over the csv module's default field limit (128 KiB)
    one_line = tmp_path / "one.csv"
    one_line.write_text(f'key,prompt\na,"{prompt}"\nb,ok\n', encoding="utf-8")
    two_lines = tmp_path / "two.csv"
    two_lines.write_text(f'key,prompt\na,"{prompt}\n{prompt}"\nb,ok\n', encoding="utf-8")
    assert [r.prompt for r in load(one_line).records] == [prompt, "ok"]  # under the 1 MiB default: read
    assert [r.prompt for r in load(two_lines).records] == [f"{prompt}\n{prompt}", "ok"]
    # Over max_line_bytes: JSONL's message for the line, and the rows after it read.
    result = load(one_line, on_error="skip", max_line_bytes=100_000)
    assert [r.prompt for r in result.records] == ["ok"]
    assert [str(e) for e in result.errors] == [
        f"{one_line}:2: line longer than 100000 bytes (dataset.max_line_bytes): is this a text file of prompts? "
        f"Split the line, or raise dataset.max_line_bytes"]
    assert csv.field_size_limit() == limit  # the process-wide setting is the module's again


def test_a_link_to_a_missing_file_is_refused_naming_where_it_points_not_skipped(tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"prompt": "a1"}\n')
    gone = tmp_path / "moved" / "b.jsonl"
    (folder / "b.jsonl").symlink_to(gone)
    (folder / ".c.jsonl").symlink_to(gone)  # hidden: skipped, as hidden files are
    (folder / "notes.md").symlink_to(gone)  # not a prompt file's extension: never read
    with pytest.raises(DatasetError) as e:
        load(folder, on_error="skip")
    assert str(e.value) == (f"dataset.path={str(folder)!r}: {folder / 'b.jsonl'} is a symbolic link to {str(gone)!r}, "
                            f"which does not exist (moved or deleted, or links that loop); every file of the folder "
                            f"is the dataset. Point the link at the file, or remove it")
    # The link as the dataset itself, and in a brace list: where it points, not a bare "no such file".
    with pytest.raises(DatasetError, match=rf"is a symbolic link to {str(gone)!r}, which does not exist"):
        load(folder / "b.jsonl")
    with pytest.raises(DatasetError, match=rf"b.jsonl \(a symbolic link to {str(gone)!r}, which does not exist\)"):
        load(f"{folder}/{{a,b}}.jsonl")
    # The fix it names works: the link points at the file again.
    gone.parent.mkdir()
    gone.write_text('{"prompt": "b1"}\n')
    assert [r.prompt for r in load(folder).records] == ["a1", "b1"]


@pytest.mark.parametrize("ext, text", [("txt", "a red fox\nblue lake\n"), ("csv", "prompt\na red fox\n"),
                                       ("jsonl", '{"prompt": "a red fox"}\n{"prompt": "blue lake"}\n')])
@pytest.mark.parametrize("encoding, pattern", [("utf-16-le", "a NUL byte every other byte"),
                                               ("utf-16-be", "a NUL byte every other byte"),
                                               ("utf-32-le", "three NUL bytes in every four"),
                                               ("utf-32-be", "three NUL bytes in every four")])
def test_utf16_or_32_without_a_byte_order_mark_is_refused_not_read_as_nul_filled_prompts(tmp_path, ext, text,
                                                                                        encoding, pattern):
    path = tmp_path / f"p.{ext}"
    path.write_bytes(text.encode(encoding))
    name = encoding.upper().replace("-LE", "LE").replace("-BE", "BE")
    with pytest.raises(DatasetError) as e:
        load(path, on_error="skip")
    assert str(e.value) == (f"{path}:1: not UTF-8: it looks like {name} without a byte order mark ({pattern}); "
                            f"re-encode it as UTF-8, e.g. `iconv -f {name} -t UTF-8 {path} > prompts-utf8.{ext}`")
    # The fix it names works.
    path.write_bytes(path.read_bytes().decode(encoding).encode("utf-8"))
    assert load(path).records[0].prompt == "a red fox"


def test_a_prompt_holding_nul_characters_is_a_bad_row_in_every_format(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    utf16 = "blue lake".encode("utf-16-le")  # one line pasted from a UTF-16 file into a UTF-8 one
    looks_utf16 = ("prompt is not UTF-8 text: it looks like UTF-16 (a NUL character every other character, "
                   "'b\\x00l\\x00u\\x00e\\x00 \\x00l...); re-encode the file as UTF-8")
    one_nul = "prompt holds a NUL character (U+0000) at index 1, which no text has; remove it"
    txt = tmp_path / "p.txt"
    txt.write_bytes(b"a red fox\n" * 4 + utf16 + b"\nok\n")
    csv = tmp_path / "p.csv"
    csv.write_bytes(b"prompt\n" + b"a red fox\n" * 4 + utf16 + b"\nok\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a red fox"}\n{"prompt": "a\\u0000b"}\n{"prompt": "ok"}\n')
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a red fox", "a\x00b", "ok"]}), parquet)
    for path, bad in ((txt, f"{txt}:5: {looks_utf16}"), (csv, f"{csv}:6: {looks_utf16}"),
                      (jsonl, f"{jsonl}:2: {one_nul}"), (parquet, f"{parquet}:2: {one_nul}")):
        result = load(path, on_error="skip")
        assert [str(e) for e in result.errors] == [bad]
        assert result.records[-1].prompt == "ok" and all("\x00" not in r.prompt for r in result.records)


def test_the_planner_refuses_a_nul_escape_as_the_reader_does_not_through_its_fast_lane(tmp_path):
    from jobs.models.registry import get_family
    from jobs.plan.build import plan_dataset
    from tests.helpers import compose_cfg

    path = tmp_path / "p.jsonl"  # clean JSONL otherwise: the planner's Arrow lane would take it whole
    path.write_text('{"prompt": "a red fox"}\n{"prompt": "a\\u0000b"}\n')
    cfg = compose_cfg([f"dataset.path={path}", f"output_dir={tmp_path / 'out'}"])
    with pytest.raises(DatasetError, match=rf"{path}:2: prompt holds a NUL character \(U\+0000\) at index 1"):
        plan_dataset(cfg, get_family(cfg.model.family).spatial_divisor(cfg.model), tmp_path / "work")
