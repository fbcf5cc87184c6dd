"""Row rules: one parsed dataset row -> a `Record`, or a `RowError` with a precise reason.

Scope: the record types and the per-row checks shared by every format. Readers
(`dataset_formats.py`) hand over a dict of fields, a bare prompt string, or a `Bad` they
found while parsing; `RowValidator` checks each field and keeps every key unique.

Rows are data: values are type-checked and compared, never evaluated. This runs once per
row over files of millions of rows, so the accepted path allocates nothing but the record
(no regex compilation, no logging, no exception).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Sequence, Union, final

from jobs.errors import UserError

MAX_KEY_CHARS = 200
MAX_SIDE = 8192
MAX_STEPS = 1000
MAX_FRAMES = 1024  # Wan's default is 81, LTX-2's 121: a four-digit count is a typo or a memory bomb
MAX_FPS = 240.0
SEED_END = 2**63  # seeds feed torch.Generator.manual_seed, which takes a signed 64-bit value

OPTIONAL_FIELDS = ("negative_prompt", "seed", "width", "height", "steps", "guidance_scale", "num_frames", "fps")
INT_FIELDS = ("seed", "width", "height", "steps", "num_frames")
FLOAT_FIELDS = ("guidance_scale", "fps")
TEXT_FIELDS = ("negative_prompt",)

# Control characters corrupt logs and terminals, and lone surrogates cannot be written as
# UTF-8 at all; the sink encodes every other character of a key reversibly.
_BAD_KEY_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


@final  # load_dataset sorts rows by `type(out) is Record`: final lets mypy narrow the other branch
@dataclass(frozen=True, slots=True)
class Record:
    """One validated prompt; unset optional fields mean "use the job's sampling config"."""

    key: str
    prompt: str
    negative_prompt: Optional[str] = None
    seed: Optional[int] = None
    width: Optional[int] = None
    height: Optional[int] = None
    steps: Optional[int] = None
    guidance_scale: Optional[float] = None
    num_frames: Optional[int] = None
    """Frames of a video (1: an image); the family decides which counts it can make."""
    fps: Optional[float] = None
    """Frames per second the video plays at (written into KEY.mp4 and its json)."""
    extra: Optional[str] = None
    """The row's dataset.keep_fields it has, as JSON text of an object (None: none kept)."""
    source: str = ""
    """Where the row came from, "path:line", for messages; empty for records built in code."""


@dataclass(frozen=True)
class RowError:
    """A bad row. `line` is 1-based: the file line (JSONL, TXT, CSV), the row (Parquet),
    or the member index of the sample's first member (webdataset tar)."""

    file: str
    line: int
    key: Optional[str]
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "key": self.key, "reason": self.reason}


class DatasetError(UserError):
    """Bad dataset input. `errors` holds the bad rows (empty for a file-level problem)."""

    def __init__(self, message: str, errors: Optional[list[RowError]] = None):
        super().__init__(message)
        self.errors = list(errors or ())


class Bad:
    """What a reader yields for a row it could not parse (bad JSON, bad bytes, ...)."""

    __slots__ = ("reason", "key")

    def __init__(self, reason: str, key: Optional[str] = None):
        self.reason = reason
        self.key = key


class _Invalid(Exception):
    """Raised by a field check; only bad rows pay for it."""


def short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(value: object) -> str:
    """A value as a message shows it: its type and a truncated repr."""
    return "null" if value is None else f"{type(value).__name__} {short_repr(value)}"


def _int_in(name: str, value: object, low: int, high: int, rule: str) -> int:
    # type() rather than isinstance(): True is an int to Python but not a seed to a user.
    if type(value) is not int:
        raise _Invalid(f"{name} must be {rule}, got {show(value)}")
    if not low <= value < high:
        raise _Invalid(f"{name} must be {rule}, got {value}")
    return value


def _seed(value: object) -> int:
    return _int_in("seed", value, 0, SEED_END, "an integer in [0, 2**63)")


def _steps(value: object) -> int:
    return _int_in("steps", value, 1, MAX_STEPS + 1, f"an integer in [1, {MAX_STEPS}]")


_SIDE_RULE = f"an integer multiple of 8 in [8, {MAX_SIDE}]"


def _side(name: str, value: object) -> int:
    value = _int_in(name, value, 1, MAX_SIDE + 1, _SIDE_RULE)
    if value % 8:
        raise _Invalid(f"{name} must be {_SIDE_RULE}, got {value}")
    return value


def _guidance(value: object) -> float:
    if type(value) is not float and type(value) is not int:
        raise _Invalid(f"guidance_scale must be a finite number >= 0, got {show(value)}")
    if not (math.isfinite(value) and value >= 0):
        raise _Invalid(f"guidance_scale must be a finite number >= 0, got {value}")
    return float(value)


def _frames(value: object) -> int:
    return _int_in("num_frames", value, 1, MAX_FRAMES + 1, f"an integer in [1, {MAX_FRAMES}]")


def _fps(value: object) -> float:
    rule = f"a number in (0, {MAX_FPS:g}], e.g. 16 or 24"
    if type(value) is not float and type(value) is not int:
        raise _Invalid(f"fps must be {rule}, got {show(value)}")
    if not (math.isfinite(value) and 0 < value <= MAX_FPS):
        raise _Invalid(f"fps must be {rule}, got {value}")
    return float(value)


def _text(value: object, name: str) -> str:
    if type(value) is not str:
        raise _Invalid(f"{name} must be a string, got {show(value)}")
    # A JSON "\ud800" escape parses, but the text cannot be tokenized or written as UTF-8.
    if not value.isascii() and _SURROGATE.search(value):
        raise _Invalid(f"{name} holds a lone surrogate (a broken \\uXXXX escape), not valid text")
    if "\x00" in value:
        raise _Invalid(_nul_reason(name, value))
    return value


def _nul_reason(name: str, value: str) -> str:
    """A NUL is no prompt's text: many of them are UTF-16 read as UTF-8 (a NUL byte every other byte)."""
    nuls = value.count("\x00")
    if nuls > 1 and nuls * 3 >= len(value):
        return (f"{name} is not UTF-8 text: it looks like UTF-16 (a NUL character every other character, "
                f"{short_repr(value, 30)}); re-encode the file as UTF-8")
    return f"{name} holds a NUL character (U+0000) at index {value.index(chr(0))}, which no text has; remove it"


def _kept_json(kept: dict) -> str:
    """The row's kept fields as the JSON text each sample's json and parquet carry. Strict JSON: Python's
    json reads and writes NaN and Infinity, but a sample's json refuses them (after the model's load, on
    every rerun), so they are a bad row here; and valid text: a lone surrogate has no UTF-8 form.
    sort_keys=False: the fields' order is the config's (the caller's dict)."""
    for name, value in kept.items():
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except ValueError:
            raise _Invalid(f"dataset.keep_fields: {name!r} holds {show(value)}: JSON has no NaN or Infinity "
                           f"(Python's json writes them); write null, a number or a string") from None
        except TypeError:  # a Parquet binary column, a timestamp: no JSON form
            raise _Invalid(f"dataset.keep_fields: {name!r} holds {show(value)}, which JSON cannot hold; keep a "
                           f"string, number, boolean, list or object column") from None
        if not text.isascii() and _SURROGATE.search(text):
            raise _Invalid(f"dataset.keep_fields: {name!r} holds a lone surrogate (a broken \\uXXXX escape), "
                           f"not valid text")
    return json.dumps(kept, ensure_ascii=False)


def _check_key(value: object) -> str:
    if type(value) is not str:
        raise _Invalid(f"key must be a non-empty string, got {show(value)}")
    if not value:
        raise _Invalid("key is empty: give a non-empty key, or leave the field out to derive one")
    if len(value) > MAX_KEY_CHARS:
        raise _Invalid(f"key is {len(value)} characters long, at most {MAX_KEY_CHARS} allowed")
    bad = _BAD_KEY_CHAR.search(value)
    if bad:
        char = bad.group()
        kind = "a lone surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
        raise _Invalid(f"key {short_repr(value)} holds {kind} U+{ord(char):04X} at index {bad.start()}")
    return value


_OPTIONAL_CHECKS = (
    ("negative_prompt", lambda value: _text(value, "negative_prompt")),
    ("seed", _seed),
    ("width", lambda value: _side("width", value)),
    ("height", lambda value: _side("height", value)),
    ("steps", _steps),
    ("guidance_scale", _guidance),
    ("num_frames", _frames),
    ("fps", _fps),
)
assert tuple(name for name, _ in _OPTIONAL_CHECKS) == OPTIONAL_FIELDS


def unknown_fields_message(unknown: Iterable[str], prompt_field: str, key_field: str) -> str:
    """`ignoring field 'guidance' (did you mean 'guidance_scale'?)`, and how to keep such fields."""
    known = (prompt_field, key_field, *OPTIONAL_FIELDS)
    parts = []
    for name in sorted(map(str, unknown)):
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    names = sorted(map(str, unknown))
    return (f"ignoring field{'s' if len(parts) > 1 else ''} {', '.join(parts)}: bcgen reads {', '.join(known)}. "
            f"To keep them in each sample's json and parquet, set dataset.keep_fields=[{','.join(names)}]")


class RowValidator:
    """Checks rows of one file in order and keeps keys unique across the whole file, or across
    every file that shares one `seen` registry."""

    def __init__(self, file: str, stem: str, prompt_field: str, key_field: str,
                 seen: Optional[dict] = None, keep: Sequence[str] = ()):
        self.file = file
        self._stem = stem
        self._prompt_field = prompt_field
        self._key_field = key_field
        self._keep = tuple(keep)
        self._known = frozenset((prompt_field, key_field, *OPTIONAL_FIELDS, *self._keep))
        # key -> ("file:line", derived?): enough to name the first holder in a duplicate message.
        self._seen: dict[str, tuple[str, bool]] = {} if seen is None else seen
        self.unknown_fields: set[str] = set()

    def derived_key(self, line: int) -> str:
        return derived_key(self._stem, line)

    def check(self, line: int, value: Union[dict, str, Bad]) -> Union[Record, RowError]:
        if type(value) is str:
            value = {self._prompt_field: value}
        elif type(value) is not dict:
            assert isinstance(value, Bad), f"reader yielded {type(value).__name__}"
            return RowError(self.file, line, value.key, value.reason)
        given = value.get(self._key_field)
        try:
            record = self._record(line, value)
        except _Invalid as bad:
            return RowError(self.file, line, given if type(given) is str else None, str(bad))
        return self._claim_key(line, record, derived=given is None)

    def _record(self, line: int, row: dict) -> Record:
        if not self._known.issuperset(row):
            self.unknown_fields.update(row.keys() - self._known)
        prompt = row.get(self._prompt_field)
        if prompt is None:
            raise _Invalid(self._missing_prompt(row))
        given = row.get(self._key_field)
        key = self.derived_key(line) if given is None else _check_key(given)
        prompt = _text(prompt, self._prompt_field)
        source = f"{self.file}:{line}"
        # Most rows carry only a key and a prompt: skip the optional checks for them.
        if len(row) == 1 + (self._key_field in row):
            return Record(key, prompt, source=source)
        options: Dict[str, Any] = {}  # Record's optional fields by name, each of its own type
        if self._keep:
            kept = {name: row[name] for name in self._keep if name in row}
            options["extra"] = _kept_json(kept) if kept else None
        for name, check in _OPTIONAL_CHECKS:
            value = row.get(name)
            if value is not None:
                options[name] = check(value)
        return Record(key, prompt, source=source, **options)

    def _missing_prompt(self, row: dict) -> str:
        name = self._prompt_field
        if name in row:
            return f"{name} must be a string, got null (an empty string \"\" means unconditional)"
        fields = ", ".join(sorted(map(str, row))) or "none"
        return (f"missing field {name!r} (this row has: {fields}); "
                f"set dataset.prompt_field if the prompt is under another name")

    def _claim_key(self, line: int, record: Record, derived: bool) -> Union[Record, RowError]:
        key = record.key
        first = self._seen.get(key)
        if first is None:
            self._seen[key] = (record.source, derived)
            return record
        where, first_derived = first
        if derived and first_derived:  # another file with this one's name stem (a/p.txt, b/p.txt)
            reason = keyless_collision(key, where, self._stem)
        elif derived:
            reason = (f"the key derived for this keyless row, {key!r}, is already the given key at "
                      f"{where}: give this row a key")
        elif first_derived:
            reason = (f"key {key!r} equals the key derived for the keyless row at {where}: "
                      f"rename this key or give that row a key")
        else:
            reason = f"duplicate key {key!r} (first at {where})"
        return RowError(self.file, line, key, reason)


def derived_key(stem: str, line: int) -> str:
    """The key of a keyless row: its file's name stem and its line."""
    return f"{stem}-{line:06d}"


def keyless_collision(key: str, where: str, stem: str) -> str:
    """The reason for a keyless row whose derived key (`<file stem>-<line>`) a keyless row of another file with
    the same name stem already took."""
    return (f"duplicate key {key!r} (first at {where}): keyless rows of files that share the name stem {stem!r} "
            f"get the same keys (<file stem>-<line>); rename one of the files, or give their rows a key")
