"""The bundled prompt set (jobs/data/prompts.jsonl): demo scenes in held-out phrasings.

Every row describes one scene of the demo world in a phrasing the demo model was not trained on
(jobs/demo/captions.py HELDOUT_*), so the default job is also an adherence test: each row's labels
(what its prompt states) come with it here, and benchmarks/bench_adherence.py scores the job's
images against them. Lengths run from one word to several hundred tokens (held-out filler
sentences after the scene), so every text bucket of the default job gets prompts.

Deterministic: a fixed seed drives every choice (tools/make_prompts.py writes the file; a test
checks that the committed file is exactly this output).
"""

from __future__ import annotations

import json
import random
from typing import Dict, List

from jobs.demo import captions as C
from jobs.demo.scenes import COLOR_NAMES, SHAPES, Labels

SEED = 20261130
#: key prefix -> (rows, filler tokens to add: none, or a range)
KINDS = {
    "word": (30, None),
    "short": (70, None),
    "caption": (250, None),
    "detailed": (110, (36, 64)),
    "scene": (20, (110, 140)),
    "story": (20, (140, 190)),
    "epic": (10, (320, 400)),
}
# Negative prompts name what the row's scene is not (another shape or colour).
NEGATIVE_FORMS = ("a {shape}", "a {color} background", "{color}", "a {shape} on a {color} background")


def _labels(rng: random.Random, i: int, with_size_position: bool) -> Labels:
    color, background = rng.sample(COLOR_NAMES, 2)
    full = C.random_labels(rng, p_size=0.6, p_position=0.5) if with_size_position else None
    return Labels(shape=SHAPES[i % len(SHAPES)], color=color, background=background,
                  size=full.size if full else None, h=full.h if full else None, v=full.v if full else None)


def _word(rng: random.Random, i: int):
    """One or two words: a shape noun, or a colour and a shape (what they state is all they pin)."""
    shape = SHAPES[i % len(SHAPES)]
    if i < 16:
        return shape, Labels(shape=shape), False
    color = COLOR_NAMES[i % len(COLOR_NAMES)]
    return f"{color} {shape}", Labels(shape=shape, color=color), False


def build_rows() -> List[Dict]:
    """Every row in file order: key, prompt, optional negative_prompt and seed, and its labels
    (`labels`, and `heldout`: True where the prompt is a held-out template)."""
    rng = random.Random(SEED)
    rows: List[Dict] = []
    seen = set()
    for kind, (count, filler) in KINDS.items():
        for i in range(count):
            if kind == "word":
                prompt, labels, heldout = _word(rng, i)
            else:
                while True:
                    labels = _labels(rng, i, with_size_position=kind != "short")
                    prompt = C.heldout_caption(rng, labels)
                    if filler:
                        prompt = C.with_filler(rng, prompt, C.HELDOUT_FILLER, rng.randint(*filler))
                    if prompt not in seen:
                        break
                heldout = True
            seen.add(prompt)
            rows.append({"key": f"{kind}-{i + 1:04d}", "prompt": prompt, "labels": labels, "heldout": heldout})
    # A handful of rows carry their own negative prompt or seed, as real datasets do.
    for n, row in enumerate(rows[40::61][:8]):
        lab = row["labels"]
        other_shape = next(s for s in SHAPES[n % 4:] + SHAPES[:n % 4] if s != lab.shape)
        other_color = next(c for c in COLOR_NAMES[n:] + COLOR_NAMES[:n] if c not in (lab.color, lab.background))
        row["negative_prompt"] = NEGATIVE_FORMS[n % len(NEGATIVE_FORMS)].format(shape=other_shape, color=other_color)
    for n, row in enumerate(rows[45::67][:8]):
        row["seed"] = 1000 + 7 * n
    rng.shuffle(rows)  # mixed lengths in file order, as in a real dataset: the plan sorts
    return rows


def render(rows: List[Dict]) -> str:
    """The JSONL text: key, prompt, and negative_prompt / seed where set (labels stay out)."""
    keep = ("key", "prompt", "negative_prompt", "seed")
    return "".join(json.dumps({k: row[k] for k in keep if k in row}, ensure_ascii=False) + "\n" for row in rows)


def labels_by_key() -> Dict[str, Dict]:
    return {row["key"]: row for row in build_rows()}
