"""Read a demo scene back from an image with a fixed pixel rule: background, object colour, shape.

1. Background: the median of a ring of pixels along the border (scenes keep a margin free of the
   shape), named by the nearest palette colour.
2. Object colour: every pixel nearer another palette colour than the background's votes for it;
   the most voted colour names the object. The object mask is then every pixel nearer that
   colour than the background colour, reduced to its largest 4-connected component.
3. Shape, from the mask's fill of its bounding box and its solidity (area over convex-hull area):
   a star is the only concave shape (solidity ~0.6); of the convex ones a square fills its box
   (~1.0), a circle ~0.79, an upright triangle ~0.5.

Deterministic numpy, no learned parts. tests/test_demo.py checks it names every drawn scene right.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from jobs.demo.scenes import COLOR_NAMES, COLORS

PALETTE = np.array([COLORS[c] for c in COLOR_NAMES], dtype=np.float32)  # [8, 3]
BORDER = 3  # px of the border ring, at 128 px (scaled with the side)
MIN_AREA = 0.004  # of the image: a smaller object counts as none
STAR_SOLIDITY = 0.8
SQUARE_FILL = 0.89
CIRCLE_FILL = 0.64


@dataclass
class Reading:
    background: str
    color: Optional[str]  # None: no object found
    shape: Optional[str]
    area: float  # object pixels / image pixels
    fill: float  # object pixels / bounding-box pixels
    solidity: float  # object pixels / convex-hull area

    def as_dict(self) -> dict:
        return asdict(self)


def nearest(pixels: np.ndarray) -> np.ndarray:
    """[..., 3] -> [...] index of the nearest palette colour."""
    d = ((pixels[..., None, :].astype(np.float32) - PALETTE) ** 2).sum(-1)
    return d.argmin(-1)


def border_ring(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    k = max(1, round(BORDER * min(h, w) / 128))
    return np.concatenate([image[:k].reshape(-1, 3), image[-k:].reshape(-1, 3),
                           image[k:-k, :k].reshape(-1, 3), image[k:-k, -k:].reshape(-1, 3)])


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component of a boolean mask (a breadth-first fill)."""
    h, w = mask.shape
    labels = np.zeros((h, w), dtype=np.int32)
    best, best_size, current = 0, 0, 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if labels[y0, x0]:
            continue
        current += 1
        labels[y0, x0] = current
        queue, size = deque([(y0, x0)]), 0
        while queue:
            y, x = queue.popleft()
            size += 1
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not labels[ny, nx]:
                    labels[ny, nx] = current
                    queue.append((ny, nx))
        if size > best_size:
            best, best_size = current, size
    return labels == best if best else np.zeros_like(mask)


def hull_area(mask: np.ndarray) -> float:
    """Area of the convex hull of the mask's pixel squares (Andrew's monotone chain)."""
    ys, xs = np.nonzero(mask)
    # the four corners of every boundary-candidate pixel: the hull of the squares, not the centres
    pts = np.unique(np.concatenate([np.stack([xs + dx, ys + dy], 1) for dx in (0, 1) for dy in (0, 1)]), axis=0)
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))].astype(np.int64)

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def chain(points):
        out = []
        for p in points:
            while len(out) >= 2 and cross(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(tuple(p))
        return out

    lower, upper = chain(pts), chain(pts[::-1])
    hull = np.array(lower[:-1] + upper[:-1], dtype=np.float64)
    x, y = hull[:, 0], hull[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def shape_of(fill: float, solidity: float) -> str:
    if solidity < STAR_SOLIDITY:
        return "star"
    if fill >= SQUARE_FILL:
        return "square"
    if fill >= CIRCLE_FILL:
        return "circle"
    return "triangle"


def classify(image: np.ndarray) -> Reading:
    """image: [H, W, 3] uint8 (or float in 0..255)."""
    image = np.asarray(image, dtype=np.float32)
    bg_rgb = np.median(border_ring(image), axis=0)
    bg = int(nearest(bg_rgb))
    names = nearest(image)
    votes = np.bincount(names[names != bg].ravel(), minlength=len(COLOR_NAMES))
    if votes.sum() < MIN_AREA * names.size:
        return Reading(COLOR_NAMES[bg], None, None, float(votes.sum() / names.size), 0.0, 0.0)
    obj = int(votes.argmax())
    # nearer the object's colour than the background's own (measured) colour
    d_obj = ((image - PALETTE[obj]) ** 2).sum(-1)
    d_bg = ((image - bg_rgb) ** 2).sum(-1)
    mask = largest_component(d_obj < d_bg)
    area = int(mask.sum())
    if area < MIN_AREA * names.size:
        return Reading(COLOR_NAMES[bg], COLOR_NAMES[obj], None, area / names.size, 0.0, 0.0)
    ys, xs = np.nonzero(mask)
    box = float((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    fill, solidity = area / box, area / max(hull_area(mask), 1.0)
    return Reading(COLOR_NAMES[bg], COLOR_NAMES[obj], shape_of(fill, solidity), area / names.size, fill, solidity)
