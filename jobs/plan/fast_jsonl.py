"""A fast lane for clean JSONL chunks: Arrow's C++ JSON reader and vectorized checks of every rule
of jobs/dataset/rules.py, instead of json.loads and a RowValidator call per row.

It answers only when the answer is certain to equal the row-by-row path: every line one JSON
object, only known fields, every value of the expected type and range. On anything else (a blank
line, a CR, a BOM, a line over dataset.max_line_bytes, a bad row, a float where an int belongs, an
escaped surrogate or NUL, an unknown field) it returns None, and the planner reads the file with the
dataset readers (jobs/dataset/formats.py), which name each bad row with its reason.
tests/test_plan_units.py checks both paths give the same plan.
"""

from __future__ import annotations

import codecs
import re
from typing import Optional

from jobs.dataset.rules import MAX_FPS, MAX_FRAMES, MAX_KEY_CHARS, MAX_SIDE, MAX_STEPS, SEED_END
from jobs.plan.resolve import Rows

# Arrow cannot hold a lone surrogate, and keeps a NUL, which the row rules reject.
_REJECTED_ESCAPE = re.compile(rb"\\[uU](?:[dD][89a-fA-F]|0000)")
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_BE)  # the readers decode these
_INTS = {"seed": (0, SEED_END - 1), "width": (8, MAX_SIDE), "height": (8, MAX_SIDE), "steps": (1, MAX_STEPS),
         "num_frames": (1, MAX_FRAMES)}


def arrow_rows(data: bytes, first_line: int, stem: str, prompt_field: str, key_field: str,
               max_line_bytes: int) -> Optional[Rows]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    n_lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if (not data or b"\n\n" in data or data.startswith((b"\n", *_BOMS)) or b"\r" in data
            or b"\x00" in data or _REJECTED_ESCAPE.search(data)):
        return None
    if not data.isascii():
        try:  # Arrow's JSON reader does not check UTF-8: a Latin-1 byte is a row error for the readers to word
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    import numpy as np

    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    if len(ends) and (ends[0] > max_line_bytes or (len(ends) > 1 and np.diff(ends).max() - 1 > max_line_bytes)):
        return None  # a line the readers would call too long
    try:
        table = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=False,
                                                                                  block_size=len(data) + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != n_lines:
        return None
    known = {prompt_field, key_field, "negative_prompt", *_INTS, "guidance_scale", "fps"}
    names = set(table.column_names)
    if not names <= known or prompt_field not in names:
        return None
    col = {name: table.column(name).combine_chunks() for name in names}

    def text_ok(a, nullable: bool) -> bool:
        return pa.types.is_string(a.type) and (nullable or a.null_count == 0)

    if not text_ok(col[prompt_field], nullable=False):
        return None
    if "negative_prompt" in col and not (text_ok(col["negative_prompt"], True)
                                         or col["negative_prompt"].type == pa.null()):
        return None
    keys_arr = col.get(key_field)
    if keys_arr is not None and keys_arr.type != pa.null():
        if not text_ok(keys_arr, nullable=True):
            return None
        given = keys_arr.drop_null()
        lengths = pc.utf8_length(given)
        if len(given) and (pc.min(lengths).as_py() < 1 or pc.max(lengths).as_py() > MAX_KEY_CHARS
                           or pc.any(pc.match_substring_regex(given, r"[\x00-\x1f\x7f-\x9f]")).as_py()):
            return None
    for name, (lo, hi) in _INTS.items():
        a = col.get(name)
        if a is None or a.type == pa.null() or a.null_count == len(a):
            continue
        if not pa.types.is_int64(a.type):
            return None
        if pc.min(a).as_py() < lo or pc.max(a).as_py() > hi:
            return None
        if name in ("width", "height") and pc.any(pc.not_equal(pc.bit_wise_and(a, 7), 0)).as_py():
            return None
    g = col.get("guidance_scale")
    if g is not None and g.type != pa.null() and g.null_count < len(g):
        if not (pa.types.is_int64(g.type) or pa.types.is_float64(g.type)):
            return None
        gf = pc.cast(g, pa.float64())
        if not pc.all(pc.is_finite(gf.drop_null())).as_py() or pc.min(gf).as_py() < 0:
            return None
    f = col.get("fps")
    if f is not None and f.type != pa.null() and f.null_count < len(f):
        if not (pa.types.is_int64(f.type) or pa.types.is_float64(f.type)):
            return None
        ff = pc.cast(f, pa.float64())
        if not pc.all(pc.is_finite(ff.drop_null())).as_py() or pc.min(ff).as_py() <= 0 or pc.max(ff).as_py() > MAX_FPS:
            return None

    n = table.num_rows
    lines = np.arange(first_line, first_line + n, dtype=np.int64)

    def values(name, typ):
        a = col.get(name)
        return pa.nulls(n, typ) if a is None or a.type == pa.null() else a.cast(typ)

    keys = values(key_field, pa.string())
    if keys.null_count:  # derived from the file's stem and line
        derived = [f"{stem}-{line:06d}"
                   for line in lines[np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))].tolist()]
        keys = pc.replace_with_mask(keys, keys.is_null(), pa.array(derived, pa.string())) if derived else keys
    return Rows(keys=keys, prompts=col[prompt_field], lines=lines, negatives=values("negative_prompt", pa.string()),
                seeds=values("seed", pa.int64()), widths=values("width", pa.int64()),
                heights=values("height", pa.int64()), steps=values("steps", pa.int64()),
                guidance=values("guidance_scale", pa.float64()), frames=values("num_frames", pa.int64()),
                fps=values("fps", pa.float64()))
