"""A contact sheet: sample images in a grid, each tile captioned with its key and a truncated prompt.

    ┌────────┬────────┬────────┐
    │ thumb  │ thumb  │ thumb  │   thumb: the image scaled to fit `thumb`² and centred
    │ key    │ key    │ key    │   caption: the key, then the prompt over the remaining lines,
    │ prompt…│ prompt…│ prompt…│            cut with "..." where it does not fit
    └────────┴────────┴────────┘

Only PIL: the sheet must be drawable on any machine the job ran on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple

BACKGROUND = (24, 24, 24)
TEXT = (230, 230, 230)
DIM_TEXT = (160, 160, 160)


@dataclass(frozen=True)
class SheetLayout:
    columns: int = 6
    """Tiles per row at most (fewer samples: one row of that many)."""
    thumb: int = 192
    """Side of the square each image is fitted into, in pixels; small images are scaled up."""
    caption_lines: int = 3
    """Text lines under each image: the key, then the prompt."""
    line_height: int = 14
    pad: int = 6

    @property
    def tile(self) -> Tuple[int, int]:
        return self.thumb + 2 * self.pad, self.thumb + 2 * self.pad + self.caption_lines * self.line_height

    def grid(self, n: int) -> Tuple[int, int]:
        cols = max(1, min(self.columns, n))
        return cols, max(1, math.ceil(n / cols))

    def size(self, n: int) -> Tuple[int, int]:
        cols, rows = self.grid(n)
        return cols * self.tile[0], rows * self.tile[1]

    def thumb_box(self, i: int, n: int) -> Tuple[int, int, int, int]:
        """(left, top, right, bottom) of tile i's thumbnail square on the sheet."""
        cols, _ = self.grid(n)
        x, y = (i % cols) * self.tile[0] + self.pad, (i // cols) * self.tile[1] + self.pad
        return x, y, x + self.thumb, y + self.thumb


@dataclass(frozen=True)
class Tile:
    image: object  # PIL.Image.Image
    key: str
    prompt: str


def fit(image, side: int):
    """The image scaled so its longer side is `side`; nearest-neighbour when enlarging, so tiny
    test images show their real pixels instead of a blur."""
    from PIL import Image

    w, h = image.size
    scale = side / max(w, h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return image.convert("RGB").resize(size, Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.LANCZOS)


def font(size: int):
    """DejaVu Sans where the system has it (it covers accented and most non-Latin letters),
    else Pillow's own font (Latin only; others draw as boxes)."""
    from PIL import ImageFont

    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        pass
    try:
        return ImageFont.load_default(size=size)  # a scalable font where Pillow has FreeType
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def clip(text: str, fnt, width: int) -> str:
    """The longest prefix of `text` (whole, or ending in "...") that fits `width` pixels."""
    if fnt.getlength(text) <= width:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # binary search: prompts can be thousands of characters long
        mid = (lo + hi + 1) // 2
        if fnt.getlength(text[:mid].rstrip() + "...") <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + "..."


def wrap(text: str, fnt, width: int, lines: int) -> List[str]:
    """Greedy word wrap into at most `lines` lines; the last one is clipped with "..."."""
    words = " ".join(text.split()).split(" ")
    out: List[str] = []
    while words and len(out) < lines - 1:
        line = words.pop(0)
        while words and fnt.getlength(line + " " + words[0]) <= width:
            line += " " + words.pop(0)
        if fnt.getlength(line) > width:  # one word wider than the tile
            line = clip(line, fnt, width)
        out.append(line)
    if words:
        out.append(clip(" ".join(words), fnt, width))
    return out


def contact_sheet(tiles: Sequence[Tile], layout: SheetLayout = SheetLayout()):
    """The sheet as a PIL image, tiles in the given order, row by row."""
    from PIL import Image, ImageDraw

    assert tiles, "a contact sheet needs at least one tile"
    n = len(tiles)
    sheet = Image.new("RGB", layout.size(n), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    fnt = font(layout.line_height - 3)
    for i, tile in enumerate(tiles):
        left, top, _, bottom = layout.thumb_box(i, n)
        thumb = fit(tile.image, layout.thumb)
        sheet.paste(thumb, (left + (layout.thumb - thumb.width) // 2, top + (layout.thumb - thumb.height) // 2))
        y = bottom + 2
        draw.text((left, y), clip(tile.key, fnt, layout.thumb), font=fnt, fill=TEXT)
        for line in wrap(tile.prompt, fnt, layout.thumb, layout.caption_lines - 1):
            y += layout.line_height
            draw.text((left, y), line, font=fnt, fill=DIM_TEXT)
    return sheet
