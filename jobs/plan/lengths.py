"""Token counts without token ids: a stand-in tokenizer that the families' `text_lengths` call.

Planning needs only how many tokens each prompt has (to pick its text bucket), never the ids.
For a BERT-style fast tokenizer (BertNormalizer with lowercasing, BertPreTokenizer, WordPiece),
a printable-ASCII prompt's count is exactly the sum, over its pre-tokens, of each word's
WordPiece length, plus the special tokens. Pre-tokens of printable ASCII after lowercasing are
runs of [a-z0-9] and single punctuation characters (BERT treats every other printable ASCII
character as punctuation), and words repeat a lot across prompts, so a per-word cache answers
most prompts with one regex and a few dict lookups: about 10x the batched Rust tokenizer on 2
cores. Anything else (non-ASCII, control characters, other tokenizers, calls with options) goes
to the real tokenizer, so counts are exact either way (tests/test_plan_lengths.py compares).
"""

from __future__ import annotations

import re
from typing import Dict, List, Sequence

_WORDS = re.compile(r"[a-z0-9]+|[^a-z0-9 \t\n\r]")
_NOT_SIMPLE = re.compile(r"[^\x20-\x7e\t\n\r]")  # printable ASCII + BERT's whitespace only
_CACHE_LIMIT = 1_000_000  # distinct words kept; a bound on memory for corpora of random strings


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
        self._words: Dict[str, int] = {}
        if self.fast:
            self._model = tokenizer.backend_tokenizer.model
            self._max_word = int(self._model.max_input_chars_per_word)
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
        special = self._special[add_special_tokens]
        out: List[int] = [0] * len(texts)
        slow: List[int] = []
        lookup, findall, not_simple = self._words.__getitem__, _WORDS.findall, _NOT_SIMPLE.search
        for i, text in enumerate(texts):
            if not_simple(text):
                slow.append(i)
                continue
            pieces = findall(text.lower())
            try:  # the hot path: every word seen before, summed in C
                out[i] = special + sum(map(lookup, pieces))
            except KeyError:
                out[i] = special + sum(self._word_len(w) for w in pieces)
        if slow:
            self.slow_calls += 1
            ids = self.tokenizer([texts[i] for i in slow], add_special_tokens=add_special_tokens)["input_ids"]
            for i, seq in zip(slow, ids):
                out[i] = len(seq)
        self.fast_hits += len(texts) - len(slow)
        return out

    def _word_len(self, word: str) -> int:
        # WordPiece maps a word longer than max_input_chars_per_word to one [UNK].
        n = self._words.get(word)
        if n is not None:
            return n
        n = 1 if len(word) > self._max_word else len(self._model.tokenize(word))
        if len(self._words) < _CACHE_LIMIT:
            self._words[word] = n
        return n
