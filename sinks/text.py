"""The `json` and `txt` kinds: cheap enough to encode on the caller's thread, in `check`.

json: sorted keys, UTF-8, no NaN (not JSON; strict readers refuse it), so equal dicts give equal
bytes. txt: UTF-8; `surrogatepass` keeps a caption with a lone surrogate (read from a mis-decoded
file) writable instead of failing the sample.
"""

from __future__ import annotations

import json
from typing import Any

from sinks.kinds import Encoder, register_encoder


def json_bytes(value: Any, where: str) -> bytes:
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: meta is not JSON-serializable ({err}); pass str/int/float/bool/list/dict "
                         f"values.") from None
    return text.encode("utf-8")


def text_bytes(value: Any, where: str, name: str = "caption") -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {name} must be a str, got {type(value).__name__}.")
    return value.encode("utf-8", errors="surrogatepass")


def _check_json(value: Any, ext: str, where: str) -> bytes:
    if not isinstance(value, (dict, list)):
        raise ValueError(f"{where}: the .{ext} member must be a dict or list, got {type(value).__name__}.")
    return json_bytes(value, where)


def _check_txt(value: Any, ext: str, where: str) -> bytes:
    return text_bytes(value, where, f"the .{ext} member")


def _already_bytes(payload: bytes, ext: str, config) -> bytes:
    return payload  # check made the bytes


register_encoder(Encoder("json", ("json",), _check_json, _already_bytes))
register_encoder(Encoder("txt", ("txt",), _check_txt, _already_bytes))
