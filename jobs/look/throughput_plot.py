"""The throughput plot: images/s over time from the job's timeline (jobs/telemetry/timeline.py), drawn with PIL.

Each batch's items are spread evenly over the interval since the previous batch of its part (the
first batch: since the generate stage started), then summed over parts into time bins and stacked
by signature, so the height is the whole job's images/s and the colours show which signature ran.
Vertical marks where a batch began: a capture (green, triangle on top), a release or eviction of
graphs (red, triangle at the bottom). Idle time between runs (a job killed and resumed an hour later) is cut out and
marked with a dashed line, so a resumed job still reads as one plot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from jobs.telemetry.timeline import BatchEntry

# tab10, then darker variants: distinct on white, in this order of first appearance.
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (16, 60, 90), (128, 64, 7),
           (22, 80, 22), (107, 20, 20), (74, 52, 95), (70, 43, 38), (114, 60, 97), (64, 64, 64), (94, 95, 17),
           (12, 95, 104)]
CAPTURE = (0, 150, 60)
RELEASE = (200, 30, 30)
AXIS = (40, 40, 40)
GRID = (225, 225, 225)


@dataclass(frozen=True)
class PlotLayout:
    width: int = 1000
    height: int = 420
    left: int = 64
    right: int = 300  # the legend's column
    top: int = 36
    bottom: int = 44
    bins: int = 120
    legend_rows: int = 16
    """Signatures listed in the legend at most; the rest are summed up in one line."""


@dataclass
class Series:
    """The timeline on one compressed clock: what the plot draws."""

    span: float
    sig_order: List[str]
    rates: Dict[str, List[float]]  # signature -> images/s per bin
    captures: List[float] = field(default_factory=list)
    releases: List[float] = field(default_factory=list)
    resumes: List[float] = field(default_factory=list)
    images: int = 0


def _runs(entries: Sequence[BatchEntry]) -> Dict[Tuple[str, float], List[BatchEntry]]:
    runs: Dict[Tuple[str, float], List[BatchEntry]] = {}
    for e in entries:
        runs.setdefault((e.part, e.start), []).append(e)
    for batch in runs.values():
        batch.sort(key=lambda e: e.t)
    return runs


def _clock(runs) -> Tuple[List[Tuple[float, float, float]], List[float]]:
    """Clusters of overlapping runs laid end to end: [(abs_start, abs_end, offset)], resume points."""
    spans = sorted((start, start + b[-1].t) for (_, start), b in runs.items())
    clusters: List[List[float]] = []
    for s, e in spans:
        if clusters and s <= clusters[-1][1]:
            clusters[-1][1] = max(clusters[-1][1], e)
        else:
            clusters.append([s, e])
    out, x, resumes = [], 0.0, []
    for s, e in clusters:
        if out:
            resumes.append(x)
        out.append((s, e, x - s))
        x += e - s
    return out, resumes


def series(entries: Sequence[BatchEntry], bins: int) -> Series:
    runs = _runs(entries)
    clusters, resumes = _clock(runs)

    def x_of(abs_t: float) -> float:
        for s, e, off in clusters:
            if s <= abs_t <= e:
                return abs_t + off
        raise AssertionError(f"time {abs_t} outside every run")

    span = max(sum(e - s for s, e, _ in clusters), 1e-6)
    width = span / bins
    order: List[str] = []
    rates: Dict[str, List[float]] = {}
    out = Series(span=span, sig_order=order, rates=rates, resumes=resumes)
    for (_, start), batch in sorted(runs.items(), key=lambda kv: kv[0][1]):
        prev, caps, rels = 0.0, 0, 0
        for e in batch:
            if e.signature not in rates:
                order.append(e.signature)
                rates[e.signature] = [0.0] * bins
            a, b = x_of(start + prev), x_of(start + e.t)
            _spread(rates[e.signature], a, b, e.items / width, width)
            out.images += e.items
            # Marked where the batch began: a capture precedes its denoise, and a run's graphs are
            # released as the next signature's first batch begins.
            if (e.captures or 0) > caps:
                out.captures.append(a)
            if (e.releases or 0) + (e.evictions or 0) > rels:
                out.releases.append(a)
            prev, caps, rels = e.t, e.captures or 0, (e.releases or 0) + (e.evictions or 0)
    return out


def _spread(row: List[float], a: float, b: float, amount_per_bin: float, width: float) -> None:
    """Add `amount` (given as items/width) spread evenly over [a, b] into the bins it covers."""
    n = len(row)
    if b - a <= width * 1e-9:  # an instant: all of it in one bin
        row[min(n - 1, int(a / width))] += amount_per_bin
        return
    for i in range(max(0, int(a / width)), min(n, int(b / width) + 1)):
        overlap = min(b, (i + 1) * width) - max(a, i * width)
        if overlap > 0:
            row[i] += amount_per_bin * width * overlap / (b - a) / width


def nice_ticks(top: float, count: int = 6) -> List[float]:
    """0, step, 2*step, ... up to at least `top`, with step 1, 2 or 5 times a power of ten."""
    raw = max(top, 1e-9) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(top / step - 1e-9)) + 1)]


def _label(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"


def throughput_plot(entries: Sequence[BatchEntry], layout: PlotLayout = PlotLayout()):
    """The plot as a PIL image; `entries` must not be empty."""
    from PIL import Image, ImageDraw

    from jobs.look.contact_sheet import clip, font

    assert entries, "a throughput plot needs timeline entries"
    s = series(entries, layout.bins)
    img = Image.new("RGB", (layout.width, layout.height), (255, 255, 255))
    d = ImageDraw.Draw(img)
    fnt, small = font(13), font(11)
    x0, y0 = layout.left, layout.height - layout.bottom  # the origin, bottom-left of the plot area
    x1, y1 = layout.width - layout.right, layout.top
    totals = [sum(r[i] for r in s.rates.values()) for i in range(layout.bins)]
    yticks = nice_ticks(max(totals) * 1.05)
    xticks = nice_ticks(s.span, 8)
    sx = lambda t: x0 + (x1 - x0) * t / s.span  # noqa: E731
    sy = lambda v: y0 - (y0 - y1) * v / yticks[-1]  # noqa: E731

    for v in yticks:
        d.line([(x0, sy(v)), (x1, sy(v))], fill=GRID)
        d.text((x0 - 6, sy(v)), _label(v), font=small, fill=AXIS, anchor="rm")
    for t in xticks:
        if t <= s.span * 1.0001:
            d.line([(sx(t), y0), (sx(t), y0 + 4)], fill=AXIS)
            d.text((sx(t), y0 + 6), _label(t), font=small, fill=AXIS, anchor="mt")
    bw = (x1 - x0) / layout.bins
    for i in range(layout.bins):  # stacked bars, signatures in order of first appearance
        base = 0.0
        for sig in s.sig_order:
            v = s.rates[sig][i]
            if v > 0:
                d.rectangle([x0 + i * bw, sy(base + v), x0 + (i + 1) * bw, sy(base)],
                            fill=PALETTE[s.sig_order.index(sig) % len(PALETTE)])
                base += v
    for t in s.resumes:
        for y in range(int(y1), int(y0), 8):
            d.line([(sx(t), y), (sx(t), min(y + 4, y0))], fill=AXIS)
    for t in s.captures:
        d.line([(sx(t), y1), (sx(t), y0)], fill=CAPTURE)
        d.polygon([(sx(t) - 5, y1 - 8), (sx(t) + 5, y1 - 8), (sx(t), y1)], fill=CAPTURE)
    for t in s.releases:
        d.line([(sx(t), y1), (sx(t), y0)], fill=RELEASE)
        d.polygon([(sx(t) - 5, y0 + 8), (sx(t) + 5, y0 + 8), (sx(t), y0)], fill=RELEASE)
    d.line([(x0, y1), (x0, y0), (x1, y0)], fill=AXIS, width=1)

    mean = s.images / s.span
    d.text((x0, 10), f"images/s over time: {s.images} images in {s.span:.1f} s, mean {mean:.3g} images/s",
           font=fnt, fill=AXIS)
    d.text(((x0 + x1) / 2, layout.height - 16), "seconds of generation (idle gaps between runs cut out)",
           font=small, fill=AXIS, anchor="mm")
    label = Image.new("RGB", (80, 16), (255, 255, 255))
    ImageDraw.Draw(label).text((40, 8), "images/s", font=small, fill=AXIS, anchor="mm")
    img.paste(label.rotate(90, expand=True), (4, int((y0 + y1) / 2) - 40))

    lx, ly = x1 + 16, y1
    keys = [(PALETTE[i % len(PALETTE)], sig, "box") for i, sig in enumerate(s.sig_order[:layout.legend_rows])]
    if len(s.sig_order) > layout.legend_rows:
        keys.append((None, f"+{len(s.sig_order) - layout.legend_rows} more signatures", "none"))
    keys += [(CAPTURE, f"capture ({len(s.captures)})", "line"),
             (RELEASE, f"release / eviction ({len(s.releases)})", "line")]
    if s.resumes:
        keys.append((AXIS, f"resumed ({len(s.resumes)})", "line"))
    for colour, text, kind in keys:
        if kind == "box":
            d.rectangle([lx, ly + 2, lx + 12, ly + 12], fill=colour)
        elif kind == "line":
            d.line([(lx, ly + 7), (lx + 12, ly + 7)], fill=colour, width=2)
        d.text((lx + 18, ly), clip(text, small, layout.right - 40), font=small, fill=AXIS)
        ly += 17
    return img
