"""The demo world's vocabulary, and how a scene is drawn: one flat shape on a flat background.

A scene is one shape (circle, square, triangle, star) of one colour on a background of another of
eight colours, at one of three sizes, somewhere in the frame (a position a caption may name).
Drawing is vectorised torch, so training draws each batch on its device, and the same code gives
the classifier's ground truth on the CPU. Everything is in fractions of the image side, so any
size draws the same scene; 2x2 supersampling anti-aliases the edges.

Shapes are upright (square axis-aligned, triangle and star point up) and their bounding boxes are
centred on the scene's centre: the classifier reads the shape from the fill of that box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

#: name -> sRGB; far enough apart (nearest pair: orange/yellow, 78 apart) to classify by distance
COLORS: Dict[str, Tuple[int, int, int]] = {
    "red": (220, 38, 38),
    "green": (34, 160, 60),
    "blue": (37, 84, 220),
    "yellow": (245, 212, 40),
    "orange": (245, 135, 25),
    "purple": (135, 55, 175),
    "white": (245, 245, 240),
    "black": (20, 20, 24),
}
COLOR_NAMES = tuple(COLORS)
SHAPES = ("circle", "square", "triangle", "star")
#: nominal radius r as a fraction of the image side, drawn uniformly in the range
SIZES: Dict[str, Tuple[float, float]] = {"small": (0.12, 0.16), "medium": (0.18, 0.23), "large": (0.25, 0.31)}
SIZE_NAMES = tuple(SIZES)
H_POSITIONS = ("left", "center", "right")
V_POSITIONS = ("top", "middle", "bottom")
#: free space between a shape's box and the image edge (the classifier reads the background there)
MARGIN = 0.06
#: the largest half-extent of any shape, in nominal radii (the star's half width)
EXTENT = 1.05

# Shape geometry in nominal radii r: circle radius r; square half-side; triangle and star outer
# radius; star inner radius as a fraction of its outer one. Areas come out within 0.5-0.95 of the
# circle's, so every shape at one size reads as that size.
SQUARE_HALF = 0.86
TRIANGLE_OUTER = 1.2
STAR_OUTER = 1.1
STAR_INNER = 0.45


@dataclass(frozen=True)
class Labels:
    """What a caption says about a scene; None leaves that attribute open (drawn at random)."""

    shape: Optional[str] = None
    color: Optional[str] = None
    background: Optional[str] = None
    size: Optional[str] = None
    h: Optional[str] = None  # left | center | right
    v: Optional[str] = None  # top | middle | bottom

    def __post_init__(self):
        for value, allowed in ((self.shape, SHAPES), (self.color, COLOR_NAMES), (self.background, COLOR_NAMES),
                               (self.size, SIZE_NAMES), (self.h, H_POSITIONS), (self.v, V_POSITIONS)):
            assert value is None or value in allowed, (value, allowed)
        assert self.color is None or self.color != self.background, "object and background share a colour"

    def as_indices(self) -> Tuple[int, int, int, int, int, int]:
        """-1 for an open attribute, else its index in the vocabulary tuple."""
        def idx(value, names):
            return -1 if value is None else names.index(value)
        return (idx(self.shape, SHAPES), idx(self.color, COLOR_NAMES), idx(self.background, COLOR_NAMES),
                idx(self.size, SIZE_NAMES), idx(self.h, H_POSITIONS), idx(self.v, V_POSITIONS))


@dataclass
class Layout:
    """A batch of fully specified scenes: vocabulary indices and geometry in fractions of the side."""

    shape: torch.Tensor  # [B] long
    color: torch.Tensor  # [B] long
    background: torch.Tensor  # [B] long
    cx: torch.Tensor  # [B] float, box centre
    cy: torch.Tensor
    r: torch.Tensor  # [B] float, nominal radius


def resolve(indices: torch.Tensor, generator: Optional[torch.Generator] = None) -> Layout:
    """[B, 6] label indices (Labels.as_indices, -1 = open) -> a drawn Layout: open attributes
    at random, sizes within their range, positions within their third of the free range."""
    device = indices.device
    b = indices.shape[0]

    def rand(*shape):
        return torch.rand(*shape, generator=generator, device=device)

    def pick(col: torch.Tensor, n: int) -> torch.Tensor:
        drawn = (rand(b) * n).long().clamp_max(n - 1)
        return torch.where(col >= 0, col, drawn)

    shape = pick(indices[:, 0], len(SHAPES))
    n_col = len(COLOR_NAMES)

    def another(of: torch.Tensor) -> torch.Tensor:  # any colour but `of`
        return (of + 1 + (rand(b) * (n_col - 1)).long().clamp_max(n_col - 2)) % n_col

    given_color, given_bg = indices[:, 1] >= 0, indices[:, 2] >= 0
    background = torch.where(given_bg, indices[:, 2],
                             torch.where(given_color, another(indices[:, 1].clamp_min(0)), pick(indices[:, 2], n_col)))
    color = torch.where(given_color, indices[:, 1], another(background))
    size = pick(indices[:, 3], len(SIZE_NAMES))
    lows = torch.tensor([SIZES[s][0] for s in SIZE_NAMES], device=device)
    highs = torch.tensor([SIZES[s][1] for s in SIZE_NAMES], device=device)
    r = lows[size] + rand(b) * (highs[size] - lows[size])
    lo = MARGIN + EXTENT * r
    hi = 1.0 - lo

    def place(col: torch.Tensor) -> torch.Tensor:
        u = rand(b)
        third = torch.where(col >= 0, (col.float() + u) / 3.0, u)  # a named third, or anywhere
        return lo + third * (hi - lo)

    return Layout(shape=shape, color=color, background=background, cx=place(indices[:, 4]), cy=place(indices[:, 5]),
                  r=r)


def _regular_star(dx: torch.Tensor, dy: torch.Tensor, points: int, outer: torch.Tensor,
                  inner: torch.Tensor) -> torch.Tensor:
    """Inside an upright star polygon (a point straight up), centred at the origin.

    Folds the angle into one half-spike, then tests the side of its edge outer vertex -> inner
    vertex. A triangle is the 3-point star whose inner radius is outer * cos(60)."""
    theta = torch.atan2(dy, dx) + math.pi / 2  # 0 at the top point (image y grows downwards)
    sector = 2 * math.pi / points
    phi = torch.remainder(theta, sector)
    phi = torch.minimum(phi, sector - phi)
    rho = torch.sqrt(dx * dx + dy * dy)
    px, py = rho * torch.cos(phi), rho * torch.sin(phi)
    half = math.pi / points
    ex, ey = inner * math.cos(half) - outer, inner * math.sin(half)  # edge vector from the outer vertex
    return ex * py - ey * (px - outer) >= 0


def coverage(layout: Layout, side: int, supersample: int = 2) -> torch.Tensor:
    """[B, side, side] float in [0, 1]: how much of each pixel the shape covers."""
    device = layout.r.device
    n = side * supersample
    grid = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n
    x = grid.view(1, 1, n)
    y = grid.view(1, n, 1)
    cx, cy, r = (t.float().view(-1, 1, 1) for t in (layout.cx, layout.cy, layout.r))
    dx, dy = x - cx, y - cy
    circle = dx * dx + dy * dy <= r * r
    square = torch.maximum(dx.abs(), dy.abs()) <= SQUARE_HALF * r
    # Triangle and star: shift so their bounding boxes, not their centres, sit at (cx, cy).
    t_outer = TRIANGLE_OUTER * r
    triangle = _regular_star(dx, dy - t_outer * 0.25, 3, t_outer, t_outer * 0.5)
    s_outer = STAR_OUTER * r
    star = _regular_star(dx, dy - s_outer * (1 - math.cos(math.pi / 5)) / 2, 5, s_outer, s_outer * STAR_INNER)
    masks = torch.stack([circle, square, triangle, star], dim=1)  # [B, 4, n, n], in SHAPES order
    inside = masks.gather(1, layout.shape.view(-1, 1, 1, 1).expand(-1, 1, n, n))[:, 0].float()
    return torch.nn.functional.avg_pool2d(inside[:, None], supersample)[:, 0]


def palette(device=None) -> torch.Tensor:
    """[8, 3] float in [0, 1], in COLOR_NAMES order."""
    return torch.tensor([COLORS[c] for c in COLOR_NAMES], dtype=torch.float32, device=device) / 255.0


def render(layout: Layout, side: int, supersample: int = 2) -> torch.Tensor:
    """[B, 3, side, side] float in [0, 1]."""
    alpha = coverage(layout, side, supersample)[:, None]
    pal = palette(layout.r.device)
    fg = pal[layout.color].view(-1, 3, 1, 1)
    bg = pal[layout.background].view(-1, 3, 1, 1)
    return alpha * fg + (1 - alpha) * bg
