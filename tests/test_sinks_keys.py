"""Keys -> tar member stems: reversible, injective, never a '.' or '/', readable by both readers."""

import itertools

import pytest

from sinks.keys import MAX_STEM_LEN, is_hashed_stem, key_from_stem, member_stem

NASTY_KEYS = [
    "plain_key-1",
    "../x",
    "..",
    ".",
    "a.b",
    "a.b.c",
    "a/b",
    "/abs/path",
    "a\\b",
    "%41",
    "A",
    "%",
    "%2E",
    "a b",
    " ",
    "\x00",
    "\n\t\r",
    "\x7f",
    "ü",
    "日本語",
    "emoji🙂",
    "\ud800",  # lone surrogate
    "~",
    "a~b",
    "prompts.jsonl:17",
    "x" * MAX_STEM_LEN,
    "x" * (MAX_STEM_LEN + 1),
    "y" * 500,
    "é" * 200,
    "é" * 200 + "!",
]


@pytest.mark.parametrize("key", NASTY_KEYS)
def test_stem_is_safe(key):
    stem = member_stem(key)
    assert "." not in stem and "/" not in stem and "\\" not in stem
    assert stem.isascii() and stem.isprintable() and " " not in stem
    assert 0 < len(stem) <= MAX_STEM_LEN


@pytest.mark.parametrize("key", [k for k in NASTY_KEYS if not is_hashed_stem(member_stem(k))])
def test_round_trip(key):
    assert key_from_stem(member_stem(key)) == key


def test_no_two_keys_collide():
    keys = NASTY_KEYS + ["".join(p) for p in itertools.product(["a", ".", "%", "/", "2E", "~"], repeat=3)]
    stems = [member_stem(k) for k in keys]
    assert len(set(stems)) == len(set(keys))
    # The classic trap: an escape-looking key must not collide with the key it looks like.
    assert member_stem("%41") != member_stem("A")
    assert member_stem("a%2Eb") != member_stem("a.b")


def test_long_keys_hash_and_say_so():
    long_a, long_b = "k" * 300 + "a", "k" * 300 + "b"
    stem_a, stem_b = member_stem(long_a), member_stem(long_b)
    assert stem_a != stem_b and stem_a.startswith("kkkk") and is_hashed_stem(stem_a)
    with pytest.raises(ValueError, match="read the original key from the sample's json"):
        key_from_stem(stem_a)
    # The boundary: exactly MAX_STEM_LEN encoded chars stays plain and decodable.
    assert key_from_stem(member_stem("x" * MAX_STEM_LEN)) == "x" * MAX_STEM_LEN


def test_hashed_prefix_never_ends_in_a_partial_escape():
    for n in range(50, 70):
        stem = member_stem("a" * n + "é" * 100)
        prefix = stem.split("~")[0]
        assert "%" not in prefix[-2:], stem


@pytest.mark.parametrize("bad", ["", None, 3])
def test_empty_or_non_string_key_is_refused(bad):
    with pytest.raises(ValueError, match="keys must be non-empty strings"):
        member_stem(bad)


@pytest.mark.parametrize("stem", ["a.b", "a/b", "%4", "%zz", "%2e", "%41", "%FF", ""])
def test_non_canonical_stems_are_refused(stem):
    with pytest.raises(ValueError, match="not made by member_stem"):
        key_from_stem(stem)
