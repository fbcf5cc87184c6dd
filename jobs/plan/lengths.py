"""Token counts without token ids: a stand-in tokenizer that the families' `text_lengths` call.

Planning needs only how many tokens each prompt has (to pick its text bucket), never the ids.
For a BERT-style fast tokenizer (BertNormalizer with lowercasing, BertPreTokenizer, WordPiece),
a printable-ASCII prompt's count is exactly the sum, over its pre-tokens, of each word's
WordPiece length, plus the special tokens. Pre-tokens of printable ASCII after lowercasing are
runs of [a-z0-9] and single punctuation characters (BERT treats every other printable ASCII
character as punctuation), and words repeat a lot across prompts, so a per-word cache answers
most prompts with a regex and a few table lookups; the regex, split and sums run in Arrow's C++ kernels over a whole chunk. Anything else (non-ASCII, control characters, other tokenizers, calls with options) goes
to the real tokenizer, so counts are exact either way (tests/test_plan_lengths.py compares).
"""

from __future__ import annotations

import re
from typing import List, Sequence

_NOT_SIMPLE = re.compile(r"[^\x20-\x7e\t\n\r]")  # printable ASCII + BERT's whitespace only
_PUNCT = r"([^a-z0-9 \t\n\r])"  # after lowercasing: BERT splits every such character off alone
_CACHE_LIMIT = 500_000  # distinct words kept; bounds memory (and lookup cost) on a long tail of rare words


def _is_bert_wordpiece(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    norm, pre, model = backend.normalizer, backend.pre_tokenizer, backend.model
    return (type(norm).__name__ == "BertNormalizer" and type(pre).__name__ == "BertPreTokenizer"
            and type(model).__name__ == "WordPiece" and b'"lowercase":true' in norm.__getstate__()
            and not getattr(tokenizer, "added_tokens_encoder", {}).keys() - set(tokenizer.all_special_tokens))


class LengthTokenizer:
    """Answers `tok(texts[, add_special_tokens=...])["input_ids"]` with sequences of the right
    length (ranges), and delegates everything else to the wrapped tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.fast = _is_bert_wordpiece(tokenizer)
        self._vocab = None  # words seen (Arrow strings) and their WordPiece lengths
        self._vocab_len = None
        if self.fast:
            self._backend = tokenizer.backend_tokenizer
            self._special = {flag: len(tokenizer("", add_special_tokens=flag)["input_ids"]) for flag in (True, False)}
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
        special = self._special[add_special_tokens]
        if not len(arr):
            return np.zeros(0, np.int64)
        simple = pc.and_(pc.string_is_ascii(arr), pc.invert(pc.match_substring_regex(arr, _NOT_SIMPLE.pattern)))
        simple_np = simple.to_numpy(zero_copy_only=False)
        # Pre-tokens, vectorized: lowercase, put spaces around each punctuation character, split.
        spaced = pc.replace_substring_regex(pc.ascii_lower(arr), _PUNCT, r" \1 ")
        words = pc.ascii_split_whitespace(spaced)
        flat = pc.list_flatten(words)
        parents = pc.list_parent_indices(words).to_numpy()
        enc = flat.dictionary_encode()
        per_word = self._word_lengths(enc.dictionary)
        weights = per_word[enc.indices.to_numpy()] if len(per_word) else np.zeros(0, np.int64)
        out = np.bincount(parents, weights=weights, minlength=len(arr)).astype(np.int64) + special
        slow = np.flatnonzero(~simple_np)
        if len(slow):
            self.slow_calls += 1
            texts = arr.take(pa.array(slow)).to_pylist()
            ids = self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
            out[slow] = [len(seq) for seq in ids]
        self.fast_hits += len(arr) - len(slow)
        return out

    def _word_lengths(self, words):
        """WordPiece length of each distinct word (an Arrow string array): known words by one
        vectorized lookup, new ones by one batched call of the Rust tokenizer."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        out = np.zeros(len(words), np.int64)
        if self._vocab is not None and len(words):
            idx = pc.index_in(words, value_set=self._vocab)
            known = idx.is_valid().to_numpy(zero_copy_only=False)
            out[known] = self._vocab_len[idx.drop_null().to_numpy()]
        else:
            known = np.zeros(len(words), bool)
        new = words.filter(pa.array(~known))
        if len(new):
            # A pre-token goes through normalizer and pre-tokenizer unchanged, so the WordPiece model
            # alone gives its pieces (one [UNK] past max_input_chars_per_word, as in a prompt);
            # model.tokenize skips building an Encoding: ~6x cheaper than encode_batch a word.
            tokenize = self._backend.model.tokenize
            lengths = np.fromiter((len(tokenize(w)) for w in new.to_pylist()), np.int64, count=len(new))
            out[~known] = lengths
            if self._vocab is None or len(self._vocab) < _CACHE_LIMIT:
                self._vocab = new if self._vocab is None else pa.concat_arrays([self._vocab, new])
                self._vocab_len = lengths if self._vocab_len is None else np.concatenate([self._vocab_len, lengths])
        return out
