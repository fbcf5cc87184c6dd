"""Captions for demo scenes, in two disjoint sets of phrasings: one to train on, one held out.

A caption is a sentence template filled with words for the object colour, shape, size,
position and background colour. Training uses TRAIN_TEMPLATES and TRAIN_FILLER; the bundled
prompts and the adherence benchmark use HELDOUT_TEMPLATES and HELDOUT_FILLER, so every measured
prompt is phrased in a way training never saw verbatim (tests/test_demo.py checks the sets share
no template and no filler sentence). Shape nouns, colour names and size words are common to both:
what is held out is the sentence around them.

Long captions append filler: sentences about rendering that name no colour, shape or place, so
the model learns to ignore them; that gives the bundled prompts their spread of token lengths.
"""

from __future__ import annotations

import random
import re
from typing import List, Optional, Sequence, Tuple

from jobs.demo.scenes import COLOR_NAMES, SHAPES, Labels

SHAPE_WORDS = {
    "circle": ("circle", "disc", "disk", "dot", "round shape"),
    "square": ("square", "box", "block", "square shape"),
    "triangle": ("triangle", "triangular shape"),
    "star": ("star", "five-pointed star", "star shape"),
}
SIZE_WORDS = {
    "small": ("small", "little", "tiny"),
    "medium": ("medium-sized", "mid-sized", "medium"),
    "large": ("large", "big", "huge"),
}
H_WORDS = {"left": "left", "center": "", "right": "right"}
V_WORDS = {"top": "top", "middle": "", "bottom": "bottom"}
CORNER_PHRASES = ("in the corner", "in a corner", "tucked into a corner")

# Templates: {o} object colour, {s} shape word, {z} size word, {p} position phrase, {b} background
# colour. An empty {z} or {p} disappears with its space.
TRAIN_TEMPLATES = (
    "a {z} {o} {s} on a {b} background {p}",
    "{b} backdrop, {o} {s} {p}",
    "{o} {s} on {b}",
    "a {o} {s} against a {b} backdrop",
    "{z} {o} {s} {p}, {b} background",
    "an image of a {z} {o} {s} on a {b} canvas",
    "{b} background with a {z} {o} {s} {p}",
    "the {s} is {o} and the background is {b}",
    "a {b} background. a {z} {o} {s} {p}.",
    "simple flat graphic: {o} {s}, {b} backdrop",
    "{o} {s} {p} on a {b} field",
    "a {z} {s} in {o} on a {b} background",
    "{b} canvas, {z} {o} {s}",
    "a photo of a {o} {s} {p} on a solid {b} background",
    "{z} {s}, {o}, on {b}",
    "icon of a {o} {s} over {b}",
)
HELDOUT_TEMPLATES = (
    "there is a {z} {o} {s} {p}, and the whole background is {b}",
    "on a plain {b} surface sits a single {o} {s} {p}",
    "{s} colored {o}, set against {b}",
    "a picture with a {b} background and one {z} {o} {s} in it",
    "draw a {z} {o} {s} {p} over {b}",
    "{o} {s} placed on top of a {b} backdrop {p}",
    "a {b} scene containing nothing but a {o} {s}",
    "against {b}, a {z} {s} painted {o}",
    "a {z} {o} {s} {p} with a {b} backdrop behind it",
    "{b} all around a {o} {s}",
)
# Captions that leave attributes open (drawn at random): training only.
PARTIAL_TEMPLATES = (
    ("a {o} {s}", ("shape", "color")),
    ("{s}", ("shape",)),
    ("a {z} {s}", ("shape",)),
    ("a {b} background", ("background",)),
    ("a {s} on a {b} background", ("shape", "background")),
    ("something {o} on {b}", ("color", "background")),
)

TRAIN_FILLER = (
    "The image is a clean flat graphic with crisp edges.",
    "There is no texture, gradient, shadow or outline anywhere.",
    "The composition is minimal, like an icon or a sticker.",
    "Nothing else appears in the frame.",
    "It was made for a picture book about simple forms.",
    "The lighting is even and the edges are sharp.",
    "Rendered as a vector illustration.",
    "The style is bold and graphic, in the spirit of modernist posters.",
    "Every pixel belongs either to the object or to the backdrop.",
    "No text, no logo and no watermark.",
    "The picture is calm and quiet, with a single clear subject.",
    "It could be a flash card for a toddler learning words.",
    "Drawn with a steady hand and filled with a single flat tone.",
    "There are no people, animals or plants in it.",
    "The shot is perfectly flat, seen straight on, with no perspective.",
    "A designer would call it a clean, simple pictogram.",
)
HELDOUT_FILLER = (
    "The artwork looks like a screen print with a single pass of ink.",
    "Nothing distracts from the main subject.",
    "It is the kind of graphic a teacher pins on a classroom wall.",
    "The edges are razor sharp and the fill is perfectly even.",
    "There is no noise, grain or blur in the picture.",
    "It would work as an app icon.",
    "Made with simple tools, it is tidy and plain.",
    "The whole thing is flat, quiet and uncluttered.",
)


def article_fix(text: str) -> str:
    """'a orange' -> 'an orange'; drop the doubled spaces and stray commas empty slots leave."""
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r" ([,.;:])", r"\1", text)
    text = re.sub(r"\ba ([aeiou])", r"an \1", text)
    text = re.sub(r"\bA ([aeiou])", r"An \1", text)
    return text


def position_phrase(rng: random.Random, h: Optional[str], v: Optional[str]) -> Tuple[str, Optional[str], Optional[str]]:
    """A phrase for a named position, and the position it pins (corner phrases pick a corner)."""
    if h is None and v is None:
        return "", None, None
    if h == "center" and v == "middle":
        return rng.choice(("in the center", "in the middle", "centered")), h, v
    if h in ("left", "right") and v in ("top", "bottom"):
        if rng.random() < 0.3:
            return rng.choice(CORNER_PHRASES), h, v
        return rng.choice((f"in the {v} {h} corner", f"at the {'upper' if v == 'top' else 'lower'} {h}")), h, v
    if v in (None, "middle") and h in ("left", "right"):
        return rng.choice((f"on the {h}", f"at the {h} side")), h, v
    if h in (None, "center") and v in ("top", "bottom"):
        return rng.choice((f"at the {v}", f"near the {v}")), h, v
    return "", None, None


def fill(template: str, rng: random.Random, labels: Labels) -> str:
    words = {
        "o": labels.color or "",
        "b": labels.background or "",
        "s": rng.choice(SHAPE_WORDS[labels.shape]) if labels.shape else "shape",
        "z": rng.choice(SIZE_WORDS[labels.size]) if labels.size else "",
        "p": position_phrase(rng, labels.h, labels.v)[0],
    }
    return article_fix(template.format(**words))


def random_labels(rng: random.Random, p_size: float = 0.5, p_position: float = 0.4) -> Labels:
    """A fully coloured scene; size and position named with the given probabilities."""
    color, background = rng.sample(COLOR_NAMES, 2)
    size = rng.choice(("small", "medium", "large")) if rng.random() < p_size else None
    h = v = None
    if rng.random() < p_position:
        kind = rng.randrange(4)
        if kind == 0:
            h, v = "center", "middle"
        elif kind == 1:
            h, v = rng.choice(("left", "right")), rng.choice(("top", "bottom"))
        elif kind == 2:
            h, v = rng.choice(("left", "right")), "middle"
        else:
            h, v = "center", rng.choice(("top", "bottom"))
    return Labels(shape=rng.choice(SHAPES), color=color, background=background, size=size, h=h, v=v)


def with_filler(rng: random.Random, caption: str, filler: Sequence[str], tokens: int) -> str:
    """Append filler sentences until the caption is about `tokens` words-pieces long (~1.3 a word)."""
    parts = [caption if caption.endswith(".") else caption + "."]
    pool = list(filler)
    rng.shuffle(pool)
    i = 0
    while sum(len(p.split()) for p in parts) * 1.3 < tokens:
        parts.append(pool[i % len(pool)])
        i += 1
        if i % len(pool) == 0:
            rng.shuffle(pool)
    return " ".join(parts)


def train_caption(rng: random.Random, p_partial: float = 0.12, p_long: float = 0.2) -> Tuple[str, Labels]:
    """One training caption and the labels it pins (open ones are drawn at random)."""
    labels = random_labels(rng)
    if rng.random() < p_partial:
        template, keep = rng.choice(PARTIAL_TEMPLATES)
        labels = Labels(**{k: getattr(labels, k) for k in ("shape", "color", "background", "size") if k in keep or
                           (k == "size" and "{z}" in template)})
        return fill(template, rng, labels), labels
    template = rng.choice(TRAIN_TEMPLATES)
    labels = pinned(template, rng, labels)
    caption = fill(template, rng, labels)
    if rng.random() < p_long:
        caption = with_filler(rng, caption, TRAIN_FILLER, rng.choice((40, 80, 160, 320)))
    return caption, labels


def pinned(template: str, rng: random.Random, labels: Labels) -> Labels:
    """The labels a template can state: no size or position when it has no slot for them."""
    keep = dict(shape=labels.shape, color=labels.color, background=labels.background)
    if "{z}" in template:
        keep["size"] = labels.size
    if "{p}" in template:
        keep["h"], keep["v"] = labels.h, labels.v
    return Labels(**keep)


def heldout_caption(rng: random.Random, labels: Labels, template: Optional[str] = None) -> str:
    """A caption for `labels` in a held-out phrasing (any of HELDOUT_TEMPLATES, or the given one)."""
    return fill(template or rng.choice(HELDOUT_TEMPLATES), rng, labels)


def train_pool(rng: random.Random, n: int, **kw) -> List[Tuple[str, Labels]]:
    return [train_caption(rng, **kw) for _ in range(n)]
