"""Dataset readers: one file -> (line, row) pairs, in file order.

Scope: parsing only. Each reader yields `(line, value)` where value is a dict of the row's
fields, a bare prompt string, or a `Bad` naming what could not be parsed (bad JSON, bytes
that are not UTF-8, a CSV row with too many cells). Field rules live in `dataset_validate.py`.
A problem with the whole file (no prompt column, not a tar) raises `DatasetError` at once.
Text formats read lines through `dataset_lines.read_lines`: LF, CRLF and CR end lines, a BOM picks
the encoding, and a line longer than `max_line_bytes` is a row error read in bounded memory.
A CSV record is bounded by it too: a quoted field that runs to the end of the file or past it over
several lines (an unterminated quote, which would take every row after it as its text) is a
DatasetError naming the line the quote opens on.

`line` is 1-based: the file line (JSONL, TXT, CSV, where a quoted CSV field may span lines and
the row's first line counts), the row (Parquet), or the index of the sample's first member
(webdataset tar).
"""

from __future__ import annotations

import csv
import json
import re
import tarfile
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

from jobs.dataset.lines import LineTooLong, read_lines
from jobs.dataset.rules import FLOAT_FIELDS, INT_FIELDS, OPTIONAL_FIELDS, TEXT_FIELDS, Bad, DatasetError

Row = tuple[int, Union[dict, str, Bad]]
Reader = Callable[..., Iterator[Row]]  # (path, prompt_field, key_field, max_line_bytes, keep=())

_JSON_TYPE = {dict: "object", list: "array", str: "string", int: "number", float: "number",
              bool: "boolean", type(None): "null"}
# webdataset's own split (webdataset.tariterators.base_plus_ext): the sample key is the
# member path up to the first dot of its file name, the rest is the extension.
_WDS_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_CSV_INT = re.compile(r"[+-]?[0-9]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _decode_error(exc: UnicodeDecodeError, where: str = "", key: Optional[str] = None) -> Bad:
    return Bad(f"undecodable bytes{where}: not UTF-8 at byte offset {exc.start} "
               f"({exc.object[exc.start:exc.start + 4]!r}); re-encode the file as UTF-8", key)


# --- JSONL -------------------------------------------------------------------------------

def read_jsonl(path: Path, prompt_field: str, key_field: str, max_line_bytes: int,
               keep: Sequence[str] = ()) -> Iterator[Row]:
    # Bytes in, so that one bad line is a row error rather than a decode crash of the file.
    for line, raw, _ in read_lines(path, max_line_bytes):
        if type(raw) is LineTooLong:
            yield line, Bad(raw.reason)
            continue
        if not raw or raw.isspace():
            continue
        try:
            value = json.loads(raw)
        except UnicodeDecodeError as exc:
            yield line, _decode_error(exc)
            continue
        except json.JSONDecodeError as exc:
            # Not colno: a message about the line's end should not point past it.
            column = min(exc.pos, len(raw)) + 1
            yield line, Bad(f"malformed JSON: {exc.msg} (column {column})")
            continue
        except RecursionError:
            yield line, Bad("malformed JSON: nested too deeply")
            continue
        if type(value) is dict or type(value) is str:
            yield line, value
        else:
            kind = _JSON_TYPE.get(type(value), type(value).__name__)
            yield line, Bad(f"expected a JSON object or a string, got a JSON {kind}")


# --- TXT ---------------------------------------------------------------------------------

def read_txt(path: Path, prompt_field: str, key_field: str, max_line_bytes: int,
             keep: Sequence[str] = ()) -> Iterator[Row]:
    for line, raw, _ in read_lines(path, max_line_bytes):
        if type(raw) is LineTooLong:
            yield line, Bad(raw.reason)
            continue
        if not raw or raw.isspace():
            continue
        try:
            yield line, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield line, _decode_error(exc)


# --- CSV ---------------------------------------------------------------------------------

def _csv_columns(header: list[str], path: Path, prompt_field: str, key_field: str, keep: Sequence[str]) -> dict:
    """Column name -> index, every column of the header: the validator keeps dataset.keep_fields and names the
    unknown ones (did you mean ...?) as it does a JSONL row's fields. A name the job reads or keeps may not
    appear twice; another repeated column is read once (its first), for that warning."""
    if prompt_field not in header:
        found = ", ".join(repr(c) for c in header[:20]) or "none"
        raise DatasetError(
            f"{path}:1: the CSV header has no column {prompt_field!r} (columns found: {found}). "
            f"Name the prompt column {prompt_field!r} or set dataset.prompt_field; a file of one "
            f"prompt a line with no header is dataset.format=txt")
    for name in (prompt_field, key_field, *OPTIONAL_FIELDS, *keep):
        if header.count(name) > 1:
            raise DatasetError(f"{path}:1: the CSV header names column {name!r} twice; rename one")
    return {name: header.index(name) for name in dict.fromkeys(header)}


def _csv_value(name: str, cell: str) -> object:
    """CSV cells are all text: an empty cell is an absent field, numbers are parsed here so
    that the validator sees the same types as from JSON (and a non-number stays a string,
    which it then reports)."""
    if name in INT_FIELDS:
        text = cell.strip()
        return int(text) if _CSV_INT.fullmatch(text) else cell
    if name in FLOAT_FIELDS:
        try:
            return float(cell)
        except ValueError:
            return cell
    return cell


def _csv_row(row: list[str], columns: dict, width: int, prompt_field: str) -> Union[dict, Bad]:
    if len(row) > width:
        return Bad(f"the row has {len(row)} cells but the header has {width}: "
                   f"quote fields that hold commas")
    fields = {}
    for name, index in columns.items():
        if index >= len(row):
            continue
        cell = row[index]
        if not cell.isascii() and _SURROGATE.search(cell):
            return Bad(f"undecodable bytes in column {name!r}: not UTF-8; re-encode the file as UTF-8")
        # An empty prompt cell is an empty prompt (unconditional); any other empty cell is unset.
        if cell or name == prompt_field:
            fields[name] = _csv_value(name, cell)
    return fields


class _Runaway(Exception):
    """A quoted field ran past dataset.max_line_bytes over several lines (raised through csv.reader)."""


class _CsvLines:
    """The file's lines as text for csv.reader, one item a line so its line_num stays the file's.

    A line too long to read is noted in `too_long` and handed over as a blank line. It also counts the
    bytes of the record in progress (`record()` starts the next one): csv.reader asks for another line
    within a record only inside a quoted field, and one that grows past max_line_bytes is an unterminated
    quote (or a field too long), stopped here with _Runaway rather than read to the end of the file."""

    def __init__(self, path: Path, max_line_bytes: int):
        self._lines = read_lines(path, max_line_bytes, count_quotes=True)
        self._limit = max_line_bytes
        self.too_long: list = []
        self.last = 0  # the last line handed over
        self._bytes = 0  # of the record in progress
        self._open = False  # a line of the record in progress was handed over

    def record(self) -> None:
        self._bytes, self._open = 0, False

    def __iter__(self) -> "_CsvLines":
        return self

    def __next__(self) -> str:
        line, raw, ending = next(self._lines)
        self.last = line
        if type(raw) is LineTooLong:
            if raw.quotes % 2 and not self._open:
                # It starts a record and leaves a quote open: the lines after it are its field's text, and
                # skipped alone it would hand them over as rows of their own (or one as a prompt).
                raise _OpenQuote(line)
            size, text = self._limit + 1, "\n"
            self.too_long.append((line, raw))
        else:
            size = len(raw) + len(ending)
            # surrogateescape: bad bytes become lone surrogates that _csv_row reports per row.
            text = (raw + ending).decode("utf-8", errors="surrogateescape")
        if self._open and self._bytes + size > self._limit:
            raise _Runaway()
        self._bytes += size
        self._open = True
        return text


_CLOSE = 'Close the quote (a quote inside a quoted field is written twice: "")'


class _OpenQuote(Exception):
    """A line too long to read starts a record and leaves a quote open (_CsvLines)."""

    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


def _unterminated(path: Path, start: int, end: int) -> str:
    return (f"unterminated quote starting at {path}:{start}: the quoted field opened there runs to the end of the "
            f"file (lines {start}-{end}), taking every row after it as its text. {_CLOSE}")


def _runaway(path: Path, start: int, end: int, max_line_bytes: int) -> str:
    return (f"unterminated quote starting at {path}:{start}? The quoted field opened there spans lines {start}-{end} "
            f"and more than dataset.max_line_bytes={max_line_bytes} bytes, taking the rows after it as its text. "
            f"{_CLOSE}, or raise dataset.max_line_bytes if the field is that long")


def _next_record(reader, lines: _CsvLines, path: Path, start: int, max_line_bytes: int) -> Union[list, None, Bad]:
    """The record starting on line `start`: its cells, None at the end of the file, or a Bad. A quoted field
    that swallowed the rest of the file, or more than max_line_bytes over several lines, is a DatasetError:
    no row after it can be trusted. The csv module's field limit is max_line_bytes meanwhile, as every other
    format's rows are bounded; its own (a process-wide setting, 128 KiB by default) is restored after."""
    lines.record()
    before = csv.field_size_limit(max_line_bytes)
    try:
        return next(reader, None)
    except _Runaway:
        raise DatasetError(_runaway(path, start, lines.last, max_line_bytes)) from None
    except _OpenQuote as open_quote:
        raise DatasetError(f"{path}:{open_quote.line} is longer than dataset.max_line_bytes={max_line_bytes} bytes and "
                           f"leaves a quote open, so the lines after it cannot be told from its text. {_CLOSE}, or "
                           f"raise dataset.max_line_bytes if the line is that long") from None
    except csv.Error as exc:
        end = reader.line_num
        if str(exc) == "unexpected end of data":  # strict: the file ended inside a quoted field
            if end > start:  # it took the lines after its own: the rest of the file is unread
                raise DatasetError(_unterminated(path, start, end)) from None
            return Bad(f"unterminated quote: the quoted field opened on this line runs to the end of the file. "
                       f"{_CLOSE}")
        spans = f" (on line {end}, in a quoted field opened on line {start}: is its quote unterminated?)"
        return Bad(f"malformed CSV: {exc}" + (spans if end > start else ""))
    finally:
        csv.field_size_limit(before)


def read_csv(path: Path, prompt_field: str, key_field: str, max_line_bytes: int,
             keep: Sequence[str] = ()) -> Iterator[Row]:
    lines = _CsvLines(path, max_line_bytes)
    too_long = lines.too_long
    reader = csv.reader(lines, strict=True)
    header = _next_record(reader, lines, path, 1, max_line_bytes)
    if header is None:
        return
    if isinstance(header, Bad):
        raise DatasetError(f"{path}:1: the CSV header is malformed: {header.reason}")
    columns = _csv_columns(header, path, prompt_field, key_field, keep)
    done = reader.line_num  # lines consumed so far; the next row starts on done + 1
    while True:
        start = done + 1
        row = _next_record(reader, lines, path, start, max_line_bytes)
        done = reader.line_num
        if isinstance(row, Bad):
            yield start, row
            continue
        while too_long:
            line, bad = too_long.pop(0)
            yield line, Bad(bad.reason)
        if row is None:
            return
        if row:  # [] is a blank line
            yield start, _csv_row(row, columns, len(header), prompt_field)


# --- Parquet -----------------------------------------------------------------------------

def _parquet_columns(schema, path: Path, prompt_field: str, key_field: str, keep: Sequence[str]) -> list[str]:
    """The columns read: the job's fields, dataset.keep_fields, and every other scalar column (text, number,
    boolean), so the validator keeps and warns as it does for JSONL; an image or an embedding beside the caption
    (binary, list) is never read unless kept."""
    import pyarrow as pa

    names = schema.names
    if prompt_field not in names:
        found = ", ".join(repr(c) for c in names[:20]) or "none"
        raise DatasetError(f"{path}: the Parquet file has no column {prompt_field!r} (columns found: "
                           f"{found}); set dataset.prompt_field to the prompt column")
    text_types = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                  pa.types.is_large_binary)
    for name in (prompt_field, key_field, *TEXT_FIELDS):
        if name in names:
            kind = schema.field(name).type
            if not any(is_type(kind) for is_type in text_types):
                raise DatasetError(f"{path}: column {name!r} has type {kind}, expected string; "
                                   f"cast it to string when writing the file")
    used = (prompt_field, key_field, *OPTIONAL_FIELDS, *keep)
    scalar = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_floating,
              pa.types.is_boolean)
    return [n for n in dict.fromkeys(names)
            if n in used or any(is_type(schema.field(n).type) for is_type in scalar)]


def _parquet_text(value: object, name: str) -> Union[object, Bad]:
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _decode_error(exc, f" in column {name!r}")
    return value


def read_parquet(path: Path, prompt_field: str, key_field: str, max_line_bytes: int,
                 keep: Sequence[str] = ()) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"dataset.path={path}: cannot read it as Parquet ({exc}); "
                           f"check the file, or set dataset.format") from exc
    columns = _parquet_columns(pf.schema_arrow, path, prompt_field, key_field, keep)
    binary = {n for n in columns if pa.types.is_binary(pf.schema_arrow.field(n).type)
              or pa.types.is_large_binary(pf.schema_arrow.field(n).type)}
    line = 0
    try:
        # Read only the columns we use: a dataset may carry images next to its captions.
        for batch in pf.iter_batches(batch_size=65536, columns=columns):
            values = {name: batch.column(name).to_pylist() for name in columns}
            for i in range(batch.num_rows):
                line += 1
                row, bad = {}, None
                for name in columns:
                    value = values[name][i]
                    if value is None:
                        continue
                    if name in binary:
                        value = _parquet_text(value, name)
                        if type(value) is Bad:
                            bad = value
                            break
                    if type(value) is str and len(value) > max_line_bytes:
                        bad = Bad(f"column {name!r} holds {len(value)} characters, more than "
                                  f"dataset.max_line_bytes={max_line_bytes}")
                        break
                    row[name] = value
                yield line, bad if bad is not None else row
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"dataset.path={path}: the Parquet file is corrupt after row {line} "
                           f"({exc})") from exc


# --- webdataset tar ----------------------------------------------------------------------

def _wds_sample(key: str, first: int, parts: dict, prompt_field: str, key_field: str) -> Row:
    if "txt" not in parts:
        members = ", ".join(f"{key}.{ext}" for ext in parts) or "none"
        return first, Bad(f"sample {key!r} has no .txt caption (members: {members})", key)
    for ext in ("txt", "json"):
        if type(parts.get(ext)) is LineTooLong:
            return first, Bad(f"{key}.{ext} is larger than dataset.max_line_bytes={parts[ext].limit} bytes", key)
    try:
        caption = parts["txt"].decode("utf-8")
    except UnicodeDecodeError as exc:
        return first, _decode_error(exc, f" in {key}.txt", key)
    fields: dict = {}
    if "json" in parts:
        try:
            fields = json.loads(parts["json"])
        except UnicodeDecodeError as exc:
            return first, _decode_error(exc, f" in {key}.json", key)
        except (json.JSONDecodeError, RecursionError) as exc:
            return first, Bad(f"malformed JSON in {key}.json: {exc}", key)
        if type(fields) is not dict:
            kind = _JSON_TYPE.get(type(fields), type(fields).__name__)
            return first, Bad(f"{key}.json must hold a JSON object, got a JSON {kind}", key)
    # The sample key and caption file win over same-named json fields: they are what
    # webdataset readers of this tar see.
    fields[prompt_field] = caption.rstrip("\r\n")  # `echo caption > k.txt` adds a newline
    fields[key_field] = key
    return first, fields


def read_wds(path: Path, prompt_field: str, key_field: str, max_line_bytes: int,
             keep: Sequence[str] = ()) -> Iterator[Row]:
    try:
        # Stream mode: members in order, and bodies we never read (images) are skipped.
        tar = tarfile.open(path, "r|*")
    except tarfile.TarError as exc:
        raise DatasetError(f"dataset.path={path}: not a readable tar ({exc}); "
                           f"check the file, or set dataset.format") from exc
    index = 0
    with tar:
        key: Optional[str] = None
        first = 0
        parts: Dict[str, Union[bytes, LineTooLong]] = {}
        ended: Dict[str, Tuple[int, str]] = {}  # a sample read whole: its first member's index and name
        try:
            for index, member in enumerate(tar, 1):
                match = _WDS_NAME.match(member.name) if member.isfile() else None
                if match is None:
                    continue  # directories, and names with no extension, as webdataset does
                prefix, ext = match.group(1), match.group(2).lower()
                if prefix != key:
                    if key is not None:
                        yield _wds_sample(key, first, parts, prompt_field, key_field)
                        ended[key] = (first, next(iter(parts), ""))
                    if prefix in ended:
                        raise DatasetError(_scattered(path, prefix, ended[prefix], index, member.name))
                    key, first, parts = prefix, index, {}
                if ext in ("txt", "json") and member.size > max_line_bytes:
                    # Bounded like a text line: a caption member is never read whole past the limit.
                    parts[ext] = LineTooLong(max_line_bytes)
                elif ext in ("txt", "json"):
                    body = tar.extractfile(member)
                    assert body is not None  # only regular files (member.isfile()) get here
                    parts[ext] = body.read()
                else:
                    parts[ext] = b""
        except (tarfile.TarError, EOFError) as exc:
            raise DatasetError(f"dataset.path={path}: the tar is truncated or corrupt after "
                               f"member {index} ({exc})") from exc
        if key is not None:
            yield _wds_sample(key, first, parts, prompt_field, key_field)


def _scattered(path: Path, key: str, before: Tuple[int, str], index: int, name: str) -> str:
    """A sample whose members do not follow each other: webdataset reads each run of one key as a sample, so
    its caption and its json would be two samples (`tar cf x.tar *.txt *.json` orders the tar by extension)."""
    first, ext = before
    return (f"dataset.path={path}: the members of sample {key!r} do not follow each other (its .{ext} is member "
            f"{first}, {name} is member {index}): webdataset reads a sample's files as one sample only where they "
            f"are adjacent, and `tar cf x.tar *.txt *.json` puts every caption before every json. Make the tar with "
            f"its names sorted: "
            f"`tar cf x.tar --sort=name -C FOLDER .` (GNU tar), or `ls | sort | tar cf x.tar -T -` in the folder")


READERS: dict[str, Reader] = {
    "jsonl": read_jsonl,
    "txt": read_txt,
    "csv": read_csv,
    "parquet": read_parquet,
    "wds": read_wds,
}
