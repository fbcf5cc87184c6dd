"""Every sample of a run, page by page, filtered: `python -m jobs.inspect OUT --pages [filters]`.

    OUT/_inspect/pages/index.html        the filter, the count, a link to every page
    OUT/_inspect/pages/page-0001.html    --page-size samples each, prev / next links
    OUT/_inspect/pages/images/STEM.EXT   the matching samples' images (videos: mp4; a sample's sound:
                                         STEM.wav), byte for byte (a stem that is not a plain name: a
                                         digest, names.py)
    OUT/_inspect/pages/.inspect-files    what this write made: the next one into the folder removes
                                         those it does not make again (written.py), nothing else

Filters, all of them must hold: `signature` (a part of it, e.g. `128x128` or `/s20/`), `text` (in
the prompt or the key, any case), `mode` (replay, eager, mixed), `flag` (nonfinite: NaN/Inf
images; truncated: prompts cut to the model's length). One pass over the shards in index order:
memory holds one page of samples, and a page is written once the next one has begun. Each caption
says what the file holds, as the gallery's do (an image's size; a clip's frames, size and fps; the
sound's length), read from the headers: nothing is decoded, however many samples the run holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from jobs.errors import UserError
from jobs.look.gallery import Figure, gallery_html, nav_html
from jobs.look.media_info import PyAVCheck, image_size, sound_info, video_header
from jobs.look.names import safe_name
from jobs.look.written import WrittenFiles

FLAGS = ("nonfinite", "truncated")
MODES = ("replay", "eager", "mixed")


@dataclass(frozen=True)
class Filter:
    signature: Optional[str] = None
    text: Optional[str] = None
    mode: Optional[str] = None
    flag: Optional[str] = None

    def __post_init__(self) -> None:
        if self.flag is not None and self.flag not in FLAGS:
            raise UserError(f"--flag {self.flag}: choose one of {', '.join(FLAGS)}")
        if self.mode is not None and self.mode not in MODES:
            raise UserError(f"--mode {self.mode}: choose one of {', '.join(MODES)}")

    def keeps(self, meta: dict) -> bool:
        if self.signature is not None and self.signature not in str(meta.get("signature", "")):
            return False
        if self.text is not None:
            needle = self.text.casefold()
            prompt, key = str(meta.get("prompt", "")).casefold(), str(meta.get("key", "")).casefold()
            if needle not in prompt and needle not in key:
                return False
        if self.mode is not None and meta.get("mode") != self.mode:
            return False
        return self.flag is None or bool(meta.get(self.flag))

    def describe(self) -> str:
        parts = [f"{k} {v!r}" for k, v in (("signature", self.signature), ("text", self.text), ("mode", self.mode),
                                            ("flag", self.flag)) if v is not None]
        return ", ".join(parts) or "every sample"


def page_name(n: int) -> str:
    return f"page-{n:04d}.html"


def write_pages(samples, out: Path, flt: Filter, page_size: int, title: str, pyav: PyAVCheck) -> int:
    """`samples`: (stem, ext, raw webdataset sample, its json) in shard order. Returns how many matched.
    The pages and images an earlier write left in `out` and this one does not write again are removed."""
    if page_size < 1:
        raise UserError(f"--page-size {page_size}: give at least 1")
    (out / "images").mkdir(parents=True, exist_ok=True)
    page: List[Figure] = []
    pages = matched = 0
    with WrittenFiles(out) as files:
        for stem, ext, raw, meta in samples:
            if not flt.keeps(meta):
                continue
            if len(page) == page_size:  # a next page exists: this one can link to it
                pages += 1
                _write_page(files, pages, page, title, flt, last=False)
                page = []
            matched += 1
            rel = f"images/{safe_name(stem)}.{ext}"  # a crafted member name (../../x) picks no path
            files.path(rel).write_bytes(raw[ext])
            info, sound = _caption(ext, raw[ext], pyav), None
            if "wav" in raw:  # LTX-2's sound, beside its clip (or its one-frame image)
                sound = f"images/{safe_name(stem)}.wav"
                files.path(sound).write_bytes(raw["wav"])
                info += f"; {sound_info(raw['wav'])}"
            page.append(Figure(src=rel, key=str(meta.get("key", stem)), prompt=str(meta.get("prompt", "")),
                               signature=str(meta.get("signature", "")), mode=str(meta.get("mode", "")),
                               seed=meta.get("seed"), shard=Path(raw["__url__"]).name,
                               kind="video" if ext == "mp4" else "image", audio=sound, info=info))
        if page:
            pages += 1
            _write_page(files, pages, page, title, flt, last=True)
        _write_index(files, pages, matched, page_size, title, flt)
    return matched


def _caption(ext: str, data: bytes, pyav: PyAVCheck) -> str:
    """What the file holds, from its header: an image's size, a clip's frames, size and fps."""
    missing = pyav.missing() if ext == "mp4" else None
    if missing is not None:
        return missing
    try:
        return video_header(data).describe() if ext == "mp4" else image_size(data)
    except Exception as e:  # noqa: BLE001 - a broken file is said on its page (verify names it), not a crash
        return f"{ext} does not open: {e}"


def _write_page(files: WrittenFiles, n: int, figures: Sequence[Figure], title: str, flt: Filter, last: bool) -> None:
    nav = nav_html(prev=page_name(n - 1) if n > 1 else None, up="index.html", next=None if last else page_name(n + 1))
    note = f"page {n}: {flt.describe()}"
    files.path(page_name(n)).write_text(gallery_html(f"{title}, page {n}", figures, note=note, nav=nav),
                                        encoding="utf-8")


def _write_index(files: WrittenFiles, pages: int, matched: int, page_size: int, title: str, flt: Filter) -> None:
    links = "".join(f'<li><a href="{page_name(i)}">page {i}</a></li>' for i in range(1, pages + 1))
    note = f"{matched} samples match ({flt.describe()}), {page_size} a page."
    files.path("index.html").write_text(gallery_html(title, [], note=note, nav=f"<ol>{links}</ol>"), encoding="utf-8")
