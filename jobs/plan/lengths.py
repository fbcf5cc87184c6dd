"""Token counts without token ids: a stand-in tokenizer that the families' `text_lengths` call.

Planning needs only how many tokens each prompt has (to pick its text bucket), never the ids.
For a BERT-style fast tokenizer (BertNormalizer, BertPreTokenizer, WordPiece; special tokens
only as added tokens) every stage is local between BERT's ASCII whitespace (space, tab, LF,
CR): added tokens match inside a piece, the normalizer works char by char (its NFD decomposes
and never composes, and whitespace is a starter), the pre-tokenizer splits at that whitespace
anyway and WordPiece sees one pre-token at a time. So a text's count is the special tokens plus
the sum, over its whitespace-separated pieces, of each piece's count, and pieces repeat a lot
across prompts: a chunk's texts are split and dictionary-encoded by Arrow's kernels, each
distinct piece looked up in a table, and only new pieces cost Python: printable-ASCII ones by
lowercasing, splitting off punctuation (BERT splits every non-alphanumeric printable ASCII
character off alone) and the WordPiece model on each word; any other piece (non-ASCII, a
control character, an added token's text) by the real tokenizer. \\v and \\f are the exception
(Arrow splits at them, BERT deletes them): texts holding one are counted whole by the real
tokenizer. tests/test_plan_units.py compares with the real tokenizer.
"""

from __future__ import annotations

import itertools
import re
from typing import List, Sequence

_PUNCT = r"([^a-z0-9])"  # in a lowercased printable-ASCII piece: BERT splits each such character off alone
_CACHE_LIMIT = 500_000  # distinct pieces (and words) kept; bounds memory on a long tail of rare ones


def _is_bert_wordpiece(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    norm, pre, model = backend.normalizer, backend.pre_tokenizer, backend.model
    return (type(norm).__name__ == "BertNormalizer" and type(pre).__name__ == "BertPreTokenizer"
            and type(model).__name__ == "WordPiece" and b'"lowercase":true' in norm.__getstate__()
            and not getattr(tokenizer, "added_tokens_encoder", {}).keys() - set(tokenizer.all_special_tokens)
            and not any(c in t for t in tokenizer.added_tokens_encoder for c in " \t\n\r"))


class LengthTokenizer:
    """Answers `tok(texts[, add_special_tokens=...])["input_ids"]` with sequences of the right
    length (ranges), and delegates everything else to the wrapped tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.fast = _is_bert_wordpiece(tokenizer)
        self._pieces: dict = {}  # piece -> tokens
        self._words: dict = {}  # lowercase ASCII pre-token -> WordPiece tokens
        if self.fast:
            self._backend = tokenizer.backend_tokenizer
            self._special = {flag: len(tokenizer("", add_special_tokens=flag)["input_ids"]) for flag in (True, False)}
            # Added tokens match before the normalizer: a piece holding one's text (in any case,
            # to be safe) goes to the real tokenizer.
            self._other = "|".join([r"[^\x21-\x7e]"] + [re.escape(t) for t in tokenizer.added_tokens_encoder])
        self.fast_hits = 0
        self.slow_calls = 0

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def encode(self, *args, **kwargs):
        return self.tokenizer.encode(*args, **kwargs)

    def __call__(self, texts, add_special_tokens: bool = True, **kwargs):
        if not self.fast or kwargs or isinstance(texts, str):
            self.slow_calls += 1
            return self.tokenizer(texts, add_special_tokens=add_special_tokens, **kwargs)
        return {"input_ids": [range(n) for n in self.counts(texts, add_special_tokens)]}

    def counts(self, texts: Sequence[str], add_special_tokens: bool = True) -> List[int]:
        import pyarrow as pa

        return self.counts_array(pa.array(texts, pa.string()), add_special_tokens).tolist()

    def counts_array(self, arr, add_special_tokens: bool = True):
        """Token counts of an Arrow string array (int64 NumPy), as `len(tok(texts)["input_ids"][i])`."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.fast:
            ids = self.tokenizer(arr.to_pylist(), add_special_tokens=add_special_tokens)["input_ids"]
            self.slow_calls += 1
            return np.fromiter((len(x) for x in ids), np.int64, count=len(ids))
        if not len(arr):
            return np.zeros(0, np.int64)
        pieces = pc.ascii_split_whitespace(arr)
        flat = pc.list_flatten(pieces)
        parents = pc.list_parent_indices(pieces).to_numpy()
        enc = flat.dictionary_encode()
        per_piece = self._piece_counts(enc.dictionary.to_pylist())
        weights = per_piece[enc.indices.to_numpy()] if len(per_piece) else np.zeros(0, np.int64)
        out = np.bincount(parents, weights=weights, minlength=len(arr)).astype(np.int64)
        out += self._special[add_special_tokens]
        whole = self._vf_rows(arr)
        if len(whole):
            self.slow_calls += 1
            ids = self.tokenizer(arr.take(pa.array(whole)).to_pylist(),
                                 add_special_tokens=add_special_tokens)["input_ids"]
            out[whole] = [len(seq) for seq in ids]
        self.fast_hits += len(arr) - len(whole)
        return out

    @staticmethod
    def _vf_rows(arr):
        """Rows holding \\v or \\f (one scan of the bytes first: almost always none)."""
        import numpy as np
        import pyarrow.compute as pc

        data = arr.buffers()[2]
        if data is None:
            return np.zeros(0, np.int64)
        b = np.frombuffer(data, np.uint8)
        if not ((b == 11) | (b == 12)).any():
            return np.zeros(0, np.int64)
        return np.flatnonzero(pc.match_substring_regex(arr, "[\x0b\x0c]").to_numpy(zero_copy_only=False))

    def _piece_counts(self, pieces: List[str]):
        """Tokens of each piece (no whitespace inside), from the table or counted once."""
        import numpy as np

        table = self._pieces
        out = np.fromiter(map(table.get, pieces, itertools.repeat(-1)), np.int64, count=len(pieces))
        new = np.flatnonzero(out < 0).tolist()
        if new:
            fresh = [pieces[i] for i in new]
            counts = self._count_pieces(fresh)
            out[new] = counts
            if len(table) < _CACHE_LIMIT:
                table.update(zip(fresh, counts.tolist()))
        return out

    def _count_pieces(self, pieces: List[str]):
        """New pieces, counted: printable-ASCII ones by their words (Arrow splits them, the
        WordPiece model counts each new word once), the others by the real tokenizer."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        arr = pa.array(pieces, pa.string())
        out = np.zeros(len(pieces), np.int64)
        other = pc.match_substring_regex(arr, self._other, ignore_case=True).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(other).tolist():
            out[i] = len(self._backend.encode(pieces[i], add_special_tokens=False).ids)
        self.slow_calls += int(other.any())
        simple = np.flatnonzero(~other)
        if not len(simple):
            return out
        spaced = pc.replace_substring_regex(pc.ascii_lower(arr.take(pa.array(simple))), _PUNCT, r" \1 ")
        words = pc.ascii_split_whitespace(spaced)
        enc = pc.list_flatten(words).dictionary_encode()
        distinct = enc.dictionary.to_pylist()
        known = self._words
        per_word = np.fromiter(map(known.get, distinct, itertools.repeat(-1)), np.int64, count=len(distinct))
        new = np.flatnonzero(per_word < 0)
        if len(new):
            tokenize = self._backend.model.tokenize
            fresh = [distinct[i] for i in new.tolist()]
            # A pre-token passes normalizer and pre-tokenizer unchanged, so the WordPiece model
            # alone gives its pieces (one [UNK] past max_input_chars_per_word, as in a prompt).
            lengths = [len(tokenize(w)) for w in fresh]
            per_word[new] = lengths
            if len(known) < _CACHE_LIMIT:
                known.update(zip(fresh, lengths))
        parents = pc.list_parent_indices(words).to_numpy()
        out[simple] = np.bincount(parents, weights=per_word[enc.indices.to_numpy()], minlength=len(simple))
        return out


# -- a tokenizer for planning without importing transformers ------------------------------------
#
# `import transformers` costs about 1.1 s before its first tokenizer (it scans its model modules),
# more than everything else the planner does for a few thousand prompts. A BERT WordPiece folder
# needs none of it: the counting above reads only the Rust backend, which `tokenizers` loads in
# ~30 ms. The family's own tokenizer is still loaded, lazily, for anything else asked of it.

# Where each family's planning tokenizer lives, as its load_tokenizer() finds it. A family not
# listed plans with its own load_tokenizer(); tests/test_plan_tokenizer.py checks every entry
# against it. (This belongs in the families, as a `tokenizer_dir(cfg)` hook, once jobs/models may change.)
def _sana_folder(model_cfg) -> str:
    import os

    if model_cfg.path is None:  # the tiny preset names its encoder ('minilm' or a folder)
        from jobs.models.text_encoders import resolve_encoder_path

        return resolve_encoder_path(model_cfg.tiny.text_encoder)
    return os.path.join(model_cfg.path, "tokenizer")


TOKENIZER_FOLDERS = {"sana": _sana_folder}

# tokenizer_config.json keys the backend alone honours as transformers would (or that only decoding,
# padding and truncation read, which counting never uses); any other key sends the folder to
# transformers.
_HARMLESS_CONFIG_KEYS = {
    "backend", "tokenizer_class", "is_local", "local_files_only", "max_length", "model_max_length", "stride",
    "pad_to_multiple_of", "pad_token_type_id", "padding_side", "truncation_side", "truncation_strategy",
    "clean_up_tokenization_spaces", "do_basic_tokenize", "never_split", "name_or_path", "model_input_names",
    "do_lower_case", "strip_accents", "tokenize_chinese_chars", "added_tokens_decoder",
    "cls_token", "sep_token", "pad_token", "unk_token", "mask_token",
}
_SPECIAL_KEYS = ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token")


class BackendTokenizer:
    """The part of a transformers BERT fast tokenizer that LengthTokenizer reads, answered by the
    `tokenizers` backend alone; everything else goes to the family's tokenizer, loaded on first use."""

    def __init__(self, backend, special_tokens: List[str], load):
        backend.no_truncation()  # as transformers' call does when it is not asked to truncate or pad
        backend.no_padding()
        self.backend_tokenizer = backend
        self.all_special_tokens = special_tokens
        self.added_tokens_encoder = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
        self._load, self._full = load, None

    @property
    def full(self):
        if self._full is None:
            self._full = self._load()
        return self._full

    def __getattr__(self, name):
        if name.startswith("_"):  # never load the family's tokenizer for a private name (copy, pickle)
            raise AttributeError(name)
        return getattr(self.full, name)

    def __call__(self, texts, add_special_tokens: bool = True, **kwargs):
        if texts == "" and not kwargs:  # LengthTokenizer's count of the special tokens alone
            return {"input_ids": self.backend_tokenizer.encode("", add_special_tokens=add_special_tokens).ids}
        return self.full(texts, add_special_tokens=add_special_tokens, **kwargs)

    def encode(self, text, *args, **kwargs):
        if isinstance(text, str) and not args and not kwargs:  # transformers' encode(text): specials, no truncation
            return self.backend_tokenizer.encode(text).ids
        return self.full.encode(text, *args, **kwargs)


def backend_tokenizer(folder: str, load) -> "BackendTokenizer | None":
    """A BackendTokenizer over `folder` when its tokenizer.json is a lowercasing BERT WordPiece
    whose config changes nothing transformers would build differently; else None (plan with `load()`)."""
    import json
    import os

    names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    if "tokenizer.json" not in names or "added_tokens.json" in names:
        return None
    config = _read_json(os.path.join(folder, "tokenizer_config.json"))
    special_map = _read_json(os.path.join(folder, "special_tokens_map.json"))
    if (config is None or special_map is None
            or config.get("tokenizer_class") not in ("BertTokenizer", "BertTokenizerFast")):
        return None
    if set(config) - _HARMLESS_CONFIG_KEYS or set(special_map) - set(_SPECIAL_KEYS):
        return None
    if config.get("do_basic_tokenize", True) is not True or config.get("never_split"):
        return None  # the slow tokenizer's options: refuse rather than guess how transformers reads them
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    norm = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else {}
    # transformers rebuilds the normalizer where the config disagrees with it: then it is not this file's
    if norm.get("type") != "BertNormalizer" or (
            norm.get("lowercase"), norm.get("strip_accents"), norm.get("handle_chinese_chars")) != (
            config.get("do_lower_case", True), config.get("strip_accents"), config.get("tokenize_chinese_chars", True)):
        return None
    specials = {**{k: config[k] for k in _SPECIAL_KEYS if k in config}, **special_map}
    special_tokens = sorted({_content(v) for v in specials.values()})
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    declared = {_content(v) for v in (config.get("added_tokens_decoder") or {}).values()}
    if set(special_tokens) != added or not declared <= added:  # transformers would add tokens this file lacks
        return None
    return BackendTokenizer(backend, special_tokens, load)


def _content(token) -> str:
    return token["content"] if isinstance(token, dict) else str(token)


def _read_json(path: str):
    """The file's object, {} when it is absent, None when it is not a JSON object."""
    import json
    import os

    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def planning_tokenizer(family, model_cfg) -> LengthTokenizer:
    """The planner's token counter for a family: over its tokenizer folder's backend where that is
    a plain BERT WordPiece (no transformers import), else over the family's own tokenizer."""
    load = lambda: family.load_tokenizer(model_cfg)  # noqa: E731
    where = TOKENIZER_FOLDERS.get(family.name)
    light = backend_tokenizer(where(model_cfg), load) if where is not None else None
    return LengthTokenizer(light if light is not None else load())
