"""The throughput plot: images/s over time from the job's timeline (jobs/telemetry/timeline.py), drawn with matplotlib.

Each batch's items are spread evenly over the interval since the previous batch of its part (the
first batch: since the generate stage started), then summed over parts into time bins and stacked
by signature, so the height is the whole job's images/s and the colours show which signature ran.
Vertical marks where a batch began: a capture (green, triangle on top), a release or eviction of
graphs (red, triangle at the bottom). Idle time between runs (a job killed and resumed an hour later) is cut out and
marked with a dashed line, so a resumed job still reads as one plot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple, cast

from jobs.telemetry.timeline import BatchEntry

# tab10, then darker variants: distinct on white, in this order of first appearance.
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (16, 60, 90), (128, 64, 7),
           (22, 80, 22), (107, 20, 20), (74, 52, 95), (70, 43, 38), (114, 60, 97), (64, 64, 64), (94, 95, 17),
           (12, 95, 104)]
CAPTURE = (0, 150, 60)
RELEASE = (200, 30, 30)
AXIS = (40, 40, 40)


@dataclass(frozen=True)
class PlotLayout:
    width: int = 1000  # pixels of the PNG
    height: int = 420
    right: int = 300  # the legend's column, in pixels
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
    out: List[Tuple[float, float, float]] = []
    x = 0.0
    resumes: List[float] = []
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


def _rgb(c) -> tuple:
    return tuple(v / 255 for v in c)


def throughput_plot(entries: Sequence[BatchEntry], layout: PlotLayout = PlotLayout()):
    """The plot as a PIL image of layout.width x layout.height; `entries` must not be empty."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is drawn
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from PIL import Image

    assert entries, "a throughput plot needs timeline entries"
    s = series(entries, layout.bins)
    fig = plt.figure(figsize=(layout.width / 100, layout.height / 100), dpi=100)
    try:
        ax = fig.add_axes((0.07, 0.12, 1 - 0.07 - (layout.right + 10) / layout.width, 0.78))
        width = s.span / layout.bins
        edges = [i * width for i in range(layout.bins + 1)]
        # Stacked steps, signatures in order of first appearance; not antialiased: each keeps its colour.
        ax.stackplot(edges, *[s.rates[sig] + s.rates[sig][-1:] for sig in s.sig_order], step="post",
                     colors=[_rgb(PALETTE[i % len(PALETTE)]) for i in range(len(s.sig_order))], linewidth=0,
                     antialiased=False)
        base = [sum(s.rates[sig][i] for sig in s.sig_order) for i in range(layout.bins)]
        for t in s.resumes:
            ax.axvline(t, color=_rgb(AXIS), linestyle="--", linewidth=1)
        for t in s.captures:
            ax.axvline(t, color=_rgb(CAPTURE), linewidth=1.5, antialiased=False)
        for t in s.releases:
            ax.axvline(t, color=_rgb(RELEASE), linewidth=1.5, antialiased=False)
        if s.captures:
            ax.plot(s.captures, [1.0] * len(s.captures), "v", color=_rgb(CAPTURE), transform=ax.get_xaxis_transform(),
                    clip_on=False)
        if s.releases:
            ax.plot(s.releases, [0.0] * len(s.releases), "^", color=_rgb(RELEASE), transform=ax.get_xaxis_transform(),
                    clip_on=False)
        ax.set_xlim(0, s.span)
        ax.set_ylim(0, max(max(base) * 1.05, 1e-9))
        ax.grid(axis="y", color="0.88")
        ax.set_axisbelow(True)
        ax.set_xlabel("seconds of generation (idle gaps between runs cut out)")
        ax.set_ylabel("images/s")
        ax.set_title(f"images/s over time: {s.images} images in {s.span:.1f} s, mean {s.images / s.span:.3g} images/s",
                     loc="left", fontsize=10)
        handles: List[Artist] = [Patch(color=_rgb(PALETTE[i % len(PALETTE)]), label=sig)
                                 for i, sig in enumerate(s.sig_order[:layout.legend_rows])]
        if len(s.sig_order) > layout.legend_rows:
            handles.append(Patch(color="white", label=f"+{len(s.sig_order) - layout.legend_rows} more signatures"))
        handles += [Line2D([], [], color=_rgb(CAPTURE), label=f"capture ({len(s.captures)})"),
                    Line2D([], [], color=_rgb(RELEASE), label=f"release / eviction ({len(s.releases)})")]
        if s.resumes:
            handles.append(Line2D([], [], color=_rgb(AXIS), linestyle="--", label=f"resumed ({len(s.resumes)})"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        canvas = cast(FigureCanvasAgg, fig.canvas)  # matplotlib.use("Agg") above: the canvas is Agg's
        canvas.draw()
        return Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba()).convert("RGB")
    finally:
        plt.close(fig)
