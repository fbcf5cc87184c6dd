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
            ids = self.tokenizer(arr.take(pa.array(whole)).to_pylist(), add_special_tokens=add_special_tokens)["input_ids"]
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
