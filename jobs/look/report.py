"""A look at what a job wrote (`python -m jobs.inspect`): samples chosen from the committed shards,
a contact sheet, a gallery page and the throughput plot; the page opens with the job's closing summary,
as the job logged it, read back from summary.json.

Samples come from the committed shards that index.wids.json lists (every `shard-*.tar` before
the job has written its index), read with webdataset. They are chosen round-robin over signatures
in the order the shards hold them, so a sheet of N shows every signature when there are at most N,
and the same output always gives the same sheet. Memory stays bounded: N images and the metadata of
at most N² samples, however large the output. PIL draws the sheet, matplotlib the plot. With
`--pages`, every sample (or those a filter keeps) is laid out page by page (pages.py).
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from jobs.errors import UserError
from jobs.look.contact_sheet import Tile, contact_sheet
from jobs.look.gallery import Figure, gallery_html
from jobs.look.media_info import PyAVCheck, sound_info, video_info
from jobs.look.names import safe_name
from jobs.look.pages import Filter, write_pages
from jobs.look.throughput_plot import throughput_plot
from jobs.look.written import WrittenFiles
from jobs.output.layout import INDEX_FILE, SUMMARY_FILE, TIMELINE_DIR
from jobs.telemetry.parts import merge_stats
from jobs.telemetry.timeline import read_timeline

log = logging.getLogger("jobs.inspect")

IMAGE_EXTS = ("jpg", "png", "webp")
MEDIA_EXTS = ("mp4",) + IMAGE_EXTS  # a sample's main member; a video sample's frames (f0000.png) are not
DEFAULT_OUT = "_inspect"
PAGES_DIR = "pages"


class InspectError(UserError):
    """OUTPUT_DIR is not something inspect can read; the message names the path and the fix."""


@dataclass(frozen=True)
class Sample:
    stem: str
    """The tar member stem (webdataset's __key__), a safe file name."""
    ext: str
    image: bytes
    """The main member's bytes: an image, or a video's mp4."""
    meta: dict
    shard: str
    audio: Optional[bytes] = None
    """KEY.wav, where the sample has a soundtrack."""

    @property
    def key(self) -> str:
        return str(self.meta.get("key", self.stem))


@dataclass(frozen=True)
class Report:
    out: Path
    samples: List[Sample]
    sheet: Path
    page: Path
    plot: Optional[Path]  # None when the output has no timeline


def _plain_url(index: Path, url) -> str:
    """An index entry's url must name a file in output_dir itself (a crafted index could point anywhere)."""
    if not isinstance(url, str) or "/" in url or "\\" in url or url.startswith(".") or not url:
        raise InspectError(f"{index} lists {url!r}, which is not a shard file name in output_dir; rerun the job "
                           f"to rewrite the index")
    return url


def shard_paths(output_dir: Path) -> List[Path]:
    """The committed shards, as the index lists them; every shard-*.tar when there is no index yet."""
    if not output_dir.exists():
        raise InspectError(f"{output_dir} does not exist: pass the output_dir of a bcgen job "
                           f"(a folder holding shard-*.tar and {INDEX_FILE})")
    if not output_dir.is_dir():
        raise InspectError(f"{output_dir} is not a folder: pass the output_dir of a bcgen job, not a file in it")
    index = output_dir / INDEX_FILE
    if index.is_file():
        try:
            urls = [s["url"] for s in json.loads(index.read_text())["shardlist"]]
        except (ValueError, KeyError, TypeError) as e:
            raise InspectError(f"{index} is not a wids shard index ({e}); delete it to read shard-*.tar instead, "
                               f"or rerun the job to rewrite it") from None
        # Each shard once: an index that lists one twice (a hand edit) would show its samples twice
        # (jobs.verify reports the duplicate entry).
        paths = list(dict.fromkeys(output_dir / _plain_url(index, u) for u in urls))
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise InspectError(f"{index} lists {len(missing)} shard(s) that are not there: {', '.join(missing[:3])}; "
                               f"rerun the job with the same command to restore a consistent folder")
    else:
        paths = sorted(output_dir.glob("shard-*.tar"))
    if not paths:
        raise InspectError(f"{output_dir} holds no committed shards (no shard-*.tar, or an empty {INDEX_FILE}): "
                           f"pass the output_dir of a job that has committed at least one shard")
    return paths


def damaged(output_dir: Path) -> str:
    """What to do about a damaged file in output_dir."""
    return (f"`python -m jobs.verify {output_dir}` names every damaged file, and a rerun of the job's command "
            f"quarantines them and generates their samples again")


def _media_samples(paths: Sequence[Path]):
    """(stem, ext, raw sample, its json) for every bcgen image or video sample in the shards, in shard order.
    A shard that cannot be read, or a sample json that does not parse, is an InspectError naming it."""
    import webdataset as wds

    for path in paths:
        try:
            for raw in wds.WebDataset([str(path)], shardshuffle=False):
                ext = next((e for e in MEDIA_EXTS if e in raw), None)
                if ext is not None and "json" in raw:  # anything else is not a bcgen sample
                    yield raw["__key__"], ext, raw, _sample_json(path, raw)
        except (tarfile.TarError, EOFError, OSError) as e:
            why = str(e.args[0] if e.args else e).split(" @ <")[0]  # webdataset adds the stream's repr
            raise InspectError(f"{path} cannot be read ({type(e).__name__}: {why}): the shard is damaged; "
                               f"{damaged(path.parent)}") from None


def _sample_json(path: Path, raw: dict) -> dict:
    try:
        meta = json.loads(raw["json"])
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise InspectError(f"{path}: the json of sample {raw['__key__']!r} does not parse ({e}); "
                           f"{damaged(path.parent)}") from None
    if not isinstance(meta, dict):
        raise InspectError(f"{path}: the json of sample {raw['__key__']!r} is not an object; "
                           f"{damaged(path.parent)}")
    return meta


def select(paths: Sequence[Path], n: int) -> List[Sample]:
    """N samples round-robin over signatures, signatures in order of first appearance.

    Two passes keep memory bounded whatever the output holds: the first keeps metadata only (at
    most n per signature, of the first n signatures: round-robin takes no more), the second reads
    the chosen samples' images from the shards that hold them.
    """
    groups: Dict[str, List[tuple]] = {}
    for stem, _, raw, meta in _media_samples(paths):
        sig = str(meta.get("signature", "?"))
        if sig not in groups and len(groups) >= n:
            continue
        group = groups.setdefault(sig, [])
        if len(group) < n:
            group.append((raw["__url__"], stem, meta))
    chosen: List[tuple] = []
    depth = 0
    while len(chosen) < n and any(depth < len(g) for g in groups.values()):
        chosen += [g[depth] for g in groups.values() if depth < len(g)][: n - len(chosen)]
        depth += 1
    wanted = {(url, stem): i for i, (url, stem, _) in enumerate(chosen)}
    found: Dict[int, Sample] = {}
    shards = [p for p in paths if any(str(p) == url for url, _ in wanted)]
    for stem, ext, raw, _ in _media_samples(shards):
        i = wanted.get((raw["__url__"], stem))
        if i is not None:
            found[i] = Sample(stem=stem, ext=ext, image=raw[ext], meta=chosen[i][2], shard=Path(raw["__url__"]).name,
                              audio=raw.get("wav"))
    assert len(found) == len(chosen), "a shard changed between the two passes"
    return [found[i] for i in range(len(chosen))]


def inspect_pages(output_dir: Path, out: Optional[Path], flt: Filter, page_size: int,
                  pyav: Optional[PyAVCheck] = None) -> Tuple[Path, int]:
    """Every matching sample of the run, page by page (jobs/look/pages.py): (the pages' folder, matches).
    `pyav`: the gallery's check, so that a missing PyAV is said once."""
    output_dir = Path(output_dir)
    folder = (Path(out) if out is not None else output_dir / DEFAULT_OUT) / PAGES_DIR
    writable(folder / "images")
    matched = write_pages(_media_samples(shard_paths(output_dir)), folder, flt, page_size,
                          f"bcgen output: {output_dir}", pyav or PyAVCheck())
    return folder, matched


def inspect_output(output_dir: Path, out: Optional[Path] = None, samples: int = 36,
                   pyav: Optional[PyAVCheck] = None) -> Report:
    if samples < 1:
        raise InspectError(f"--samples {samples}: give at least 1")
    output_dir = Path(output_dir)
    paths = shard_paths(output_dir)
    chosen = select(paths, samples)
    if not chosen:
        raise InspectError(f"the {len(paths)} shard(s) in {output_dir} hold no image or video samples "
                           f"(members {'/'.join(MEDIA_EXTS)} with a .json): is it a bcgen output_dir?")
    out = Path(out) if out is not None else output_dir / DEFAULT_OUT
    writable(out / "images")
    with WrittenFiles(out) as files:  # an earlier look's images of other samples, its plot: removed
        report = _draw(output_dir, paths, chosen, files, pyav or PyAVCheck())
    return report


def _draw(output_dir: Path, paths: Sequence[Path], chosen: List[Sample], files: WrittenFiles,
          pyav: PyAVCheck) -> Report:
    """The sheet, the gallery page and the plot of `chosen`, into `files`' folder."""
    tiles, figures = [], []
    for s in chosen:
        rel = f"images/{safe_name(s.stem)}.{s.ext}"
        files.path(rel).write_bytes(s.image)
        thumb, info = _thumbnail(s, pyav)
        sound = None
        if s.audio is not None:
            sound = f"images/{safe_name(s.stem)}.wav"
            files.path(sound).write_bytes(s.audio)
            info += f"; {sound_info(s.audio)}"
        tiles.append(Tile(image=thumb, key=s.key, prompt=str(s.meta.get("prompt", ""))))
        m = s.meta
        figures.append(Figure(src=rel, key=s.key, prompt=str(m.get("prompt", "")),
                              signature=str(m.get("signature", "")), mode=str(m.get("mode", "")),
                              seed=m.get("seed"), shard=s.shard,
                              kind="video" if s.ext == "mp4" else "image", audio=sound, info=info))
    sheet = files.path("contact_sheet.png")
    contact_sheet(tiles).save(sheet)

    entries = read_timeline(output_dir)
    plot = None
    if entries:
        plot = files.path("throughput.png")
        throughput_plot(entries).save(plot)
    else:
        log.warning("no timeline in %s: no throughput plot (jobs record one as they run, in %s/)",
                    output_dir / TIMELINE_DIR, TIMELINE_DIR)
    n_sigs = len({f.signature for f in figures})
    note = (f"{len(figures)} samples from {len(paths)} shard(s), {n_sigs} signature(s), chosen round-robin over "
            f"signatures." + ("" if plot else " No timeline was recorded, so there is no throughput plot."))
    page = files.path("index.html")
    extras = ["contact_sheet.png"] + (["throughput.png"] if plot else [])
    html = gallery_html(f"bcgen output: {output_dir}", figures, extras, note, summary=summary_lines(output_dir))
    page.write_text(html, encoding="utf-8")
    return Report(out=files.folder, samples=chosen, sheet=sheet, page=page, plot=plot)


def writable(folder: Path) -> None:
    """Make `folder`, or say why not: a finished dataset often sits on a read-only mount."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InspectError(f"cannot write {folder} ({e.strerror or e}): pass --out DIR, a folder you can write "
                           f"(the output_dir itself is only read)") from None


def summary_lines(output_dir: Path) -> List[str]:
    """The job's closing summary (the lines it logged at its end), from summary.json; [] where there is none
    yet (a job still running, killed) or it cannot be read: the page is drawn from the shards either way."""
    path = output_dir / SUMMARY_FILE
    if not path.is_file():
        return []
    try:
        return merge_stats([json.loads(path.read_text(encoding="utf-8"))], 1).lines()
    except Exception as e:  # noqa: BLE001 - any field of it may be damaged: named on the console, never a crash
        log.warning("%s cannot be read (%s: %s): the page has no summary", path, type(e).__name__, e)
        return []


def _thumbnail(s: Sample, pyav: PyAVCheck):
    """(PIL image for the sheet, what the page says of the member): a video's first frame and its
    frames, size and fps; an image and its size. Without PyAV a clip gets a blank tile and says so,
    never that it does not decode."""
    from PIL import Image

    if s.ext == "mp4":
        missing = pyav.missing()
        if missing is not None:
            return Image.new("RGB", (1, 1)), missing
        try:
            info = video_info(s.image)
        except Exception as e:  # noqa: BLE001 - a broken clip is reported on the page, not a crash of inspect
            log.warning("%s.mp4 (%s) does not decode: %s", s.stem, s.shard, e)
            return Image.new("RGB", (1, 1)), f"mp4 does not decode: {e}"
        return Image.fromarray(info.first), info.describe()
    try:
        image = Image.open(io.BytesIO(s.image))
        image.load()
    except Exception as e:  # noqa: BLE001 - as a clip: a broken image is reported on the page, not a crash
        log.warning("%s.%s (%s) does not decode: %s; `python -m jobs.verify` names every damaged file",
                    s.stem, s.ext, s.shard, e)
        return Image.new("RGB", (1, 1)), f"{s.ext} does not decode: {e}"
    return image, f"{image.size[0]}x{image.size[1]}"
