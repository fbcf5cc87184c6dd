"""Bounded line reading for the text formats (JSONL, TXT, CSV).

- LF, CRLF and CR each end a line: a file saved with old Mac line endings is many prompts, not one.
- A UTF-8 BOM is dropped. A UTF-16 or UTF-32 BOM decodes the file from that encoding (to UTF-8
  bytes, what the readers parse); bytes that are not valid in it are a whole-file error naming it.
  A file with no BOM whose first bytes hold a NUL every other byte is UTF-16 saved without one, and
  one with three NUL bytes in every four UTF-32: a whole-file error too (read as UTF-8 it would be
  prompts full of NUL characters, each a bad row).
- A line longer than `max_line_bytes` is yielded as `LineTooLong` (a row error for the reader; for the
  CSV reader once its end is found, with the count of its '"' bytes) and skipped chunk by chunk, never
  held whole: memory stays within one chunk plus one line whatever the file holds (one endless line of
  zeros included).

    for line, text, ending in read_lines(path, 1 << 20):   # text: bytes without the ending
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union, final

from jobs.dataset.rules import DatasetError

CHUNK = 1 << 20
DEFAULT_MAX_LINE_BYTES = 1 << 20
_EOL = re.compile(rb"(\r\n|\r|\n)")
# Longest first: the UTF-32-LE BOM begins with the UTF-16-LE one.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_SNIFF_BYTES = 4096  # of a file with no BOM, looked at for UTF-16's and UTF-32's NUL bytes


@final  # the readers test `type(raw) is LineTooLong`: final lets mypy narrow the other branch to bytes
@dataclass(frozen=True)
class LineTooLong:
    """A line that was not read whole: it is longer than `limit` bytes."""

    limit: int
    quotes: int = 0  # the line's '"' bytes: an odd count leaves a CSV quote open (formats.py's CSV reader)

    @property
    def reason(self) -> str:
        return (f"line longer than {self.limit} bytes (dataset.max_line_bytes): is this a text file of "
                f"prompts? Split the line, or raise dataset.max_line_bytes")


Line = tuple[int, Union[bytes, LineTooLong], bytes]


def _sniff(first: bytes) -> tuple[Optional[str], int]:
    """(encoding to transcode from, BOM length); encoding None means the bytes are read as they are."""
    for bom, encoding in _BOMS:
        if first.startswith(bom):
            return (None if encoding == "utf-8" else encoding), len(bom)
    return None, 0


def _bomless_wide(head: bytes) -> Optional[tuple[str, str]]:
    """(iconv's name, the NUL pattern) for ASCII saved as UTF-32 or UTF-16 without a byte order mark: a NUL
    in three of every four bytes (UTF-32, the fourth rarely), or in one half of the byte pairs and few in the
    other (UTF-16). UTF-8 text has no NUL byte at all. UTF-32 is asked first: its pairs look half NUL too."""
    sample = head[:_SNIFF_BYTES]
    quads = len(sample) // 4
    if quads:
        nul = [sample[i:4 * quads:4].count(0) for i in range(4)]  # NULs at each place of a 4-byte unit
        for name, zeros, text in (("UTF-32LE", (1, 2, 3), 0), ("UTF-32BE", (0, 1, 2), 3)):
            if all(nul[i] * 2 >= quads for i in zeros) and nul[text] * 4 < quads:
                return name, "three NUL bytes in every four"
    pairs = len(sample) // 2
    even, odd = sample[0:2 * pairs:2].count(0), sample[1:2 * pairs:2].count(0)
    if pairs and odd * 2 >= pairs and even * 4 < pairs:
        return "UTF-16LE", "a NUL byte every other byte"
    if pairs and even * 2 >= pairs and odd * 4 < pairs:
        return "UTF-16BE", "a NUL byte every other byte"
    return None


def _utf8_chunks(path: Path, f: BinaryIO) -> Iterator[bytes]:
    first = f.read(CHUNK)
    encoding, skip = _sniff(first)
    guess = None if skip else _bomless_wide(first)
    if guess:
        name, pattern = guess
        raise DatasetError(f"{path}:1: not UTF-8: it looks like {name} without a byte order mark ({pattern}); "
                           f"re-encode it as UTF-8, e.g. `iconv -f {name} -t UTF-8 {path} > prompts-utf8{path.suffix}`")
    raw = chain([first[skip:]], iter(lambda: f.read(CHUNK), b""))
    if encoding is None:
        yield from raw
        return
    decoder = codecs.getincrementaldecoder(encoding)()
    done = skip
    try:
        for chunk in raw:
            yield decoder.decode(chunk).encode("utf-8")
            done += len(chunk)
        yield decoder.decode(b"", final=True).encode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: the file starts with a {encoding.upper()} byte order mark but is not valid "
                           f"{encoding.upper()} near byte {done + exc.start}; re-encode it as UTF-8") from None


def read_lines(path: Path, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, count_quotes: bool = False) -> Iterator[Line]:
    """(1-based line number, the line's bytes or LineTooLong, its ending: b"\\n", b"\\r\\n", b"\\r" or b"");
    `count_quotes`: as for split_lines (the CSV reader's)."""
    with open(path, "rb") as f:
        yield from split_lines(_utf8_chunks(path, f), max_line_bytes, count_quotes)


def split_lines(chunks: Iterator[bytes], max_line_bytes: int, count_quotes: bool = False) -> Iterator[Line]:
    """See read_lines. A line too long is reported as soon as it is found to be, or, with `count_quotes`, at its
    end, with the count of its '"' bytes (one endless line is then read to the end of the file, in bounded
    memory, before it is reported)."""
    line = 1
    buf = bytearray()  # the current line's bytes so far, at most max_line_bytes
    too_long = False  # the current line is too long and is being skipped (reported when found, or at its end)
    quotes = 0  # '"' bytes of the line being skipped: counted, not kept
    after_cr = False  # the last chunk ended with \r: a \n starting the next one belongs to it
    for chunk in chunks:
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        after_cr = False
        if b"\r" in chunk:
            parts = _EOL.split(chunk)  # text, ending, text, ending, ..., text
            lines, rest = zip(parts[0:-1:2], parts[1::2]), parts[-1]
            after_cr = len(parts) > 1 and not rest and parts[-2] == b"\r"
        else:  # the common case, split in C: every ending is \n
            texts = chunk.split(b"\n")
            lines, rest = zip(texts[:-1], repeat(b"\n")), texts[-1]
        for text, ending in lines:
            if too_long:
                too_long = False
                if count_quotes:
                    yield line, LineTooLong(max_line_bytes, quotes + text.count(b'"')), ending
            elif len(buf) + len(text) > max_line_bytes:
                yield line, LineTooLong(max_line_bytes, buf.count(b'"') + text.count(b'"')), ending
            else:
                yield line, (bytes(buf) + text if buf else text), ending
            buf.clear()
            line += 1
        if too_long:
            quotes += rest.count(b'"')
            continue
        if len(buf) + len(rest) > max_line_bytes:
            too_long, quotes = True, buf.count(b'"') + rest.count(b'"')
            if not count_quotes:
                yield line, LineTooLong(max_line_bytes), b""
            buf.clear()
        else:
            buf += rest
    if too_long:
        if count_quotes:
            yield line, LineTooLong(max_line_bytes, quotes), b""
    elif buf:
        yield line, bytes(buf), b""
