"""Sample keys -> tar member stems, reversibly.

webdataset and wids group a sample's members by the member name up to the first dot of its
basename, and treat '/' as a directory. A raw key such as `a.b`, `../x` or `a/b` would therefore
split one sample in two, merge two samples, or point outside the shard. `member_stem` maps any
key to a stem over [A-Za-z0-9_-] plus `%XX` escapes (every other UTF-8 byte, '.', '/', '%' and
controls included). The map is injective, and `key_from_stem` inverts it; the sample's json
keeps the original key anyway, so readers never need to decode stems.

Member names live in the 100-byte USTAR name field (wids' tar reader reads only that field and
no PAX or GNU long names), so a stem is at most `MAX_STEM_LEN` characters (fewer where a sample
has a longer extension, e.g. a video's per-frame `f0000.webp`: `max_len`). A longer encoding is
shortened to a readable prefix + `~` + 128 bits of the key's sha256. `~` never occurs in a plain
stem, so hashed and plain stems cannot collide; such a stem is not decodable and
`key_from_stem` says to read the key from the sample's json.
"""

from __future__ import annotations

import hashlib
import re

_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
USTAR_NAME_BYTES = 100
_LONGEST_EXT = ".webp"  # ".json" is as long; a stem + this must fit the 100-byte USTAR name
MAX_STEM_LEN = USTAR_NAME_BYTES - len(_LONGEST_EXT)
HASH_MARK = "~"
_HASH_HEX = 32  # 128 bits: collisions need ~2**64 long keys
_PLAIN_STEM = re.compile(r"(?:[A-Za-z0-9_-]|%[0-9A-F]{2})+")


def _key_bytes(key: str) -> bytes:
    # surrogatepass: a str with lone surrogates (from a mis-decoded file) still maps injectively.
    return key.encode("utf-8", errors="surrogatepass")


def member_stem(key: str, max_len: int = MAX_STEM_LEN) -> str:
    """The tar member stem for `key`: no '.', no '/', at most `max_len` ASCII characters."""
    if not isinstance(key, str) or key == "":
        raise ValueError(f"sample key {key!r} is invalid: keys must be non-empty strings; give every record a key.")
    assert 1 + _HASH_HEX + 8 <= max_len <= MAX_STEM_LEN, max_len
    stem = "".join(chr(b) if b in _SAFE_BYTES else f"%{b:02X}" for b in _key_bytes(key))
    if len(stem) <= max_len:
        return stem
    prefix = stem[: max_len - 1 - _HASH_HEX]
    # Cut before a partial escape so the prefix stays readable as percent-encoding.
    cut = prefix.rfind("%", len(prefix) - 2)
    if cut != -1:
        prefix = prefix[:cut]
    return prefix + HASH_MARK + hashlib.sha256(_key_bytes(key)).hexdigest()[:_HASH_HEX]


def is_hashed_stem(stem: str) -> bool:
    return HASH_MARK in stem


def key_from_stem(stem: str) -> str:
    """Inverse of `member_stem` for plain stems; ValueError for hashed or non-canonical stems."""
    if is_hashed_stem(stem):
        raise ValueError(
            f"member stem {stem!r} is a hashed stem (its key encodes to more than {MAX_STEM_LEN} characters); "
            f"read the original key from the sample's json ('key' field) instead."
        )
    if not _PLAIN_STEM.fullmatch(stem):
        raise ValueError(f"member stem {stem!r} was not made by member_stem: only [A-Za-z0-9_-] and %XX escapes occur.")
    raw = bytearray()
    i = 0
    while i < len(stem):
        if stem[i] == "%":
            byte = int(stem[i + 1 : i + 3], 16)
            # Escaping a safe byte would give a second stem for one key: not canonical.
            if byte in _SAFE_BYTES:
                raise ValueError(f"member stem {stem!r} escapes the safe byte {chr(byte)!r}: not made by member_stem.")
            raw.append(byte)
            i += 3
        else:
            raw.append(ord(stem[i]))
            i += 1
    try:
        return bytes(raw).decode("utf-8", errors="surrogatepass")
    except UnicodeDecodeError as err:
        raise ValueError(f"member stem {stem!r} does not decode to UTF-8 ({err}): not made by member_stem.") from None
