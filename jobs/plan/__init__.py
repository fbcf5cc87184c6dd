"""The plan: every item's graph signature, sorted, cut into pool-sized batches.

Sorting by signature is what makes graphs pay: each captured graph replays across one long run of
same-signature batches, and is released when the run ends. The plan is a pure function of the
dataset, the config and the tokenizer, so the same inputs give the same plan on any machine, and
every rank or array task can compute it independently and take its own partition.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterable, List, Sequence, Tuple

from jobs.dataset import Record, RowError

if TYPE_CHECKING:
    from jobs.models.base import TextLength


@dataclass(frozen=True, order=True, slots=True)
class Signature:
    """The graph key the plan can enumerate: everything that changes a denoiser call's shapes or constants."""

    height: int
    width: int
    text_bucket: int
    steps: int
    guidance_scale: float
    cfg: bool
    dtype: str
    frames: int = 1

    def __str__(self) -> str:
        g = f"cfg{self.guidance_scale:g}" if self.cfg else "nocfg"
        return f"{self.height}x{self.width}/t{self.text_bucket}/s{self.steps}/{g}/{self.dtype}"


@dataclass(frozen=True, slots=True)  # slots: a plan holds millions of these
class Item:
    key: str
    prompt: str
    negative_prompt: str
    seed: int
    signature: Signature
    text_tokens: int  # used text positions (positive and, with CFG, negative: the larger)
    truncated: bool
    source: str


@dataclass
class Batch:
    signature: Signature
    items: List[Item]
    size: int  # the pool batch size this batch runs at (>= len(items) when padded)

    @property
    def n_dummy(self) -> int:
        return self.size - len(self.items)


@dataclass
class Plan:
    batches: List[Batch]
    truncated: int = 0
    signature_counts: Dict[Signature, int] = field(default_factory=dict)

    @property
    def n_items(self) -> int:
        return sum(len(b.items) for b in self.batches)

    def keys(self) -> List[str]:
        return [it.key for b in self.batches for it in b.items]

    def summary_lines(self, limit: int = 12) -> List[str]:
        lines = [f"plan: {self.n_items} items, {len(self.batches)} batches, {len(self.signature_counts)} signatures"
                 + (f", {self.truncated} prompts truncated" if self.truncated else "")]
        ranked = sorted(self.signature_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        for sig, n in ranked[:limit]:
            sizes = Counter(b.size for b in self.batches if b.signature == sig)
            pool = " ".join(f"{n_b}x{size}" for size, n_b in sorted(sizes.items(), reverse=True))
            lines.append(f"  {str(sig):40s} {n:7d} items  batches {pool}")
        if len(ranked) > limit:
            lines.append(f"  ... and {len(ranked) - limit} more signatures")
        return lines


def derive_seed(job_seed: int, key: str) -> int:
    """A seed from (job seed, key) alone: the same key gets the same noise in any batch or order."""
    digest = hashlib.sha256(f"{job_seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: fits torch.Generator.manual_seed


def cut_batches(items: Sequence[Item], sizes: Sequence[int], pad_short: bool) -> List[Tuple[List[Item], int]]:
    """Greedy largest-first cut of one signature run; a tail smaller than every size is padded up."""
    sizes = sorted({int(s) for s in sizes}, reverse=True)
    out, i = [], 0
    while i < len(items):
        left = len(items) - i
        fit = next((s for s in sizes if s <= left), None)
        if fit is None:  # tail shorter than the smallest pool size
            size = sizes[-1] if pad_short else left
            out.append((list(items[i:]), size))
            break
        out.append((list(items[i:i + fit]), fit))
        i += fit
    return out


def build_plan(items: Iterable[Item], batch_sizes: Sequence[int], pad_short: bool, truncated: int = 0) -> Plan:
    runs: Dict[Signature, List[Item]] = {}
    for it in items:
        runs.setdefault(it.signature, []).append(it)
    batches: List[Batch] = []
    for sig in sorted(runs):
        run = sorted(runs[sig], key=lambda it: it.key)
        for chunk, size in cut_batches(run, batch_sizes, pad_short):
            batches.append(Batch(signature=sig, items=chunk, size=size))
    return Plan(batches=batches, truncated=truncated, signature_counts={s: len(v) for s, v in runs.items()})


def without_keys(plan: Plan, done: set, batch_sizes: Sequence[int], pad_short: bool) -> Plan:
    """Drop committed keys and re-cut, so a resumed run's batches are still pool-sized."""
    if not done:
        return plan
    items = [it for b in plan.batches for it in b.items if it.key not in done]
    return build_plan(items, batch_sizes, pad_short, truncated=sum(1 for it in items if it.truncated))


@dataclass
class ItemDefaults:
    height: int
    width: int
    steps: int
    guidance_scale: float
    negative_prompt: str
    job_seed: int
    dtype: str
    spatial_divisor: int
    on_long_prompt: str  # truncate | fail


def resolve_items(records: Sequence[Record], defaults: ItemDefaults, lengths: Dict[Tuple[str, str], "TextLength"],
                  bucket_for) -> Tuple[List[Item], List[RowError]]:
    """Records + defaults -> items with signatures. Row-level problems become RowErrors (file:line)."""
    items, errors = [], []
    d = defaults.spatial_divisor
    for r in records:
        h = r.height or defaults.height
        w = r.width or defaults.width
        if h % d or w % d:
            errors.append(_row_error(r, f"size {h}x{w} is not a multiple of {d} (VAE downsampling x patch size); "
                                        f"use e.g. {round(h / d) * d or d}x{round(w / d) * d or d}"))
            continue
        guidance = defaults.guidance_scale if r.guidance_scale is None else float(r.guidance_scale)
        cfg = guidance > 1.0
        negative = r.negative_prompt if r.negative_prompt is not None else defaults.negative_prompt
        pos = lengths[("+", r.prompt)]
        tokens = pos.used
        if cfg:
            tokens = max(tokens, lengths[("-", negative)].used)
        if pos.truncated and defaults.on_long_prompt == "fail":
            errors.append(_row_error(r, f"prompt has {pos.raw} tokens, more than the model's {pos.limit}; "
                                        f"shorten it or set model.on_long_prompt=truncate"))
            continue
        sig = Signature(height=h, width=w, text_bucket=bucket_for(tokens), steps=r.steps or defaults.steps,
                        guidance_scale=guidance if cfg else 1.0, cfg=cfg, dtype=defaults.dtype)
        seed = r.seed if r.seed is not None else derive_seed(defaults.job_seed, r.key)
        items.append(Item(key=r.key, prompt=r.prompt, negative_prompt=negative if cfg else "", seed=seed,
                          signature=sig, text_tokens=tokens, truncated=pos.truncated, source=r.source))
    return items, errors


def _row_error(r: Record, reason: str) -> RowError:
    path, _, line = r.source.rpartition(":")
    return RowError(file=path, line=int(line) if line.isdigit() else 0, key=r.key, reason=reason)


def text_length_table(records: Sequence[Record], defaults: ItemDefaults, measure) -> Dict[Tuple[str, str], "TextLength"]:
    """Tokenize each distinct prompt once ('+' positive with the instruction prefix, '-' negative)."""
    pos = sorted({r.prompt for r in records})
    neg = sorted({(r.negative_prompt if r.negative_prompt is not None else defaults.negative_prompt) for r in records})
    table: Dict[Tuple[str, str], "TextLength"] = {}
    for sign, texts, instruction in (("+", pos, True), ("-", neg, False)):
        for start in range(0, len(texts), 4096):
            chunk = texts[start:start + 4096]
            for text, length in zip(chunk, measure(chunk, instruction)):
                table[(sign, text)] = length
    return table
