"""A static HTML gallery page: one figure per sample, with links relative to the page's folder.

Every text that came from the dataset (key, prompt) or the job (signature, mode) is HTML-escaped,
and every link is percent-encoded: member stems may hold `%XX` escapes (sinks/keys.py), which a
browser would otherwise decode into another file name.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Optional, Sequence
from urllib.parse import quote


@dataclass(frozen=True)
class Figure:
    src: str
    """The image's path relative to the page (unquoted; quoted here)."""
    key: str
    prompt: str
    signature: str
    mode: str
    seed: Optional[int]
    shard: str
    kind: str = "image"  # "image" or "video" (`src` is then an mp4, played in place)
    audio: Optional[str] = None
    """A soundtrack's path relative to the page (unquoted), or None."""
    info: str = ""
    """What the file holds (size; a video's frames and fps; sound length), read from it."""


STYLE = """
body { font-family: sans-serif; margin: 1.5em; background: #fafafa; color: #222; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 14px; }
figure { margin: 0; background: #fff; border: 1px solid #ddd; padding: 8px; }
figure img, figure video { width: 100%; image-rendering: pixelated; }
figure audio { width: 100%; }
figcaption { font-size: 12px; word-wrap: break-word; }
.key { font-weight: bold; } .meta { color: #666; font-family: monospace; }
pre.summary { background: #fff; border: 1px solid #ddd; padding: 8px; white-space: pre-wrap; font-size: 12px; }
"""


def _e(v) -> str:
    return html.escape(str(v), quote=True)


def nav_html(prev: Optional[str], up: Optional[str], next: Optional[str]) -> str:
    """Links between pages (names of pages in the same folder); a missing one is left out."""
    links = [f'<a href="{_e(quote(href))}">{label}</a>' for label, href in
             (("&larr; previous", prev), ("all pages", up), ("next &rarr;", next)) if href]
    return f'<p class="nav">{" · ".join(links)}</p>'


def gallery_html(title: str, figures: Sequence[Figure], extras: Sequence[str] = (), note: str = "",
                 nav: str = "", summary: Sequence[str] = ()) -> str:
    """The page: a header naming the output folder, the job's closing summary (`summary`, its lines),
    links to `extras` (sheet, plot), the figures; `nav` (trusted HTML this package made, nav_html) above
    and below them."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{_e(title)}</h1>"]
    if note:
        parts.append(f"<p>{_e(note)}</p>")
    if summary:
        parts.append(f'<pre class="summary">{_e(chr(10).join(summary))}</pre>')
    if nav:
        parts.append(nav)
    for src in extras:
        parts.append(f'<p><a href="{_e(quote(src))}"><img src="{_e(quote(src))}" alt="{_e(src)}" '
                     f'style="max-width:100%"></a></p>')
    parts.append('<div class="grid">')
    for f in figures:
        link = _e(quote(f.src))
        if f.kind == "video":
            media = f'<video src="{link}" controls loop muted preload="metadata"></video><a href="{link}">mp4</a>'
        else:
            media = f'<a href="{link}"><img src="{link}" alt="{_e(f.key)}" loading="lazy"></a>'
        if f.audio is not None:
            media += f'<audio src="{_e(quote(f.audio))}" controls preload="none"></audio>'
        info = f'<div class="meta">{_e(f.info)}</div>' if f.info else ""
        parts.append(
            f'<figure>{media}'
            f'<figcaption><div class="key">{_e(f.key)}</div><div>{_e(f.prompt)}</div>{info}'
            f'<div class="meta">{_e(f.signature)} · {_e(f.mode)} · seed {_e(f.seed)} · {_e(f.shard)}</div>'
            f"</figcaption></figure>")
    parts += ["</div>", nav if figures else "", "</body></html>", ""]
    return "\n".join(parts)
