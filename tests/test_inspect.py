"""A look at the output: a real tiny job records its timeline, `python -m jobs.inspect` draws it.

One job for the module (9 prompts, 3 signatures, the CPU op tape capturing every signature, so
the timeline has captures and releases), inspected once with the real CLI; the other tests read
what those two commands wrote.
"""

from __future__ import annotations

import html
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from tests.helpers import prompts, write_jsonl
from tests.test_job_e2e import FAST, ROOT, run_cli

MARKUP = 'a <b>bold</b> & "quoted" prompt, long enough that the contact sheet has to cut it short'
SAMPLES = 6
ODD_KEY = "k003 odd.1/%"  # its member stem holds %XX escapes, which page links must quote again


def tar_samples(out: Path) -> dict:
    """stem -> (image bytes, meta) for every sample in every committed shard, read with tarfile."""
    found = {}
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        for name, data in members.items():
            stem, ext = name.rsplit(".", 1)
            if ext == "jpg":
                found[stem] = (data, json.loads(members[f"{stem}.json"]))
    return found


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    rows = prompts(9)
    for i, r in enumerate(rows):  # three signatures: (steps, guidance) differ by row
        r.update({1: {"steps": 3}, 2: {"guidance_scale": 3.0}}.get(i % 3, {}))
    rows[4]["prompt"] = MARKUP
    rows[3]["key"] = ODD_KEY
    data = write_jsonl(tmp / "prompts.jsonl", rows)
    out, view = tmp / "out", tmp / "view"
    # The pool of four sizes, so each signature's 3 rows are cut 2 + 1: the timeline then has batches
    # of two sizes a signature (the image presets' default, [8], would pad each run to one batch).
    # bcg.warmup=random: every batch's first call captures, so each timeline line says replay (with
    # the default, live, a key's first batch of these few steps is all warm-up calls: eager).
    job = run_cli(f"dataset.path={data}", f"output_dir={out}", "sink.maxcount=4", "bcg.backend=tape",
                  "bcg.capture=always", "bcg.warmup=random", "bcg.batch_sizes=[1,2,4,8]", *FAST)
    (tmp / "job.log").write_text(job.stdout + job.stderr)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "jobs.inspect", str(out), "--out", str(view), "--samples",
                           str(SAMPLES)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, view, rows


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.hrefs = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a["src"])
        if tag == "a":
            self.hrefs.append(a["href"])


def test_timeline_has_one_line_per_batch(inspected):
    out, _, rows = inspected
    (timeline,) = (out / "_timeline").glob("*.jsonl")  # one worker, one file
    lines = [json.loads(l) for l in timeline.read_text().splitlines()]
    metas = [m for _, m in tar_samples(out).values()]
    assert sum(l["items"] for l in lines) == len(rows) == len(metas)
    # The plan cuts each signature's run into full pool-size batches, so a sample written at batch
    # size b is one b-th of a batch: this counts batches from the shards alone.
    assert len(lines) == round(sum(1 / m["batch_size"] for m in metas))
    by_sig = {}
    for m in metas:
        by_sig[m["signature"]] = by_sig.get(m["signature"], 0) + 1
    assert {s: sum(l["items"] for l in lines if l["signature"] == s) for s in by_sig} == by_sig
    assert all(0 < l["items"] <= l["batch_size"] and l["mode"] == "replay" for l in lines)
    ts = [l["t"] for l in lines]
    assert ts == sorted(ts) and len({l["start"] for l in lines}) == 1
    graph = json.loads((out / "summary.json").read_text())["graph"]
    assert lines[-1]["captures"] == graph["captures"] == 6  # every (signature, batch size) captured
    # Runs end when the next signature begins; the last release comes after the last batch.
    assert [l["releases"] for l in lines] == [0, 0, 1, 1, 2, 2] and graph["releases"] == 3


def test_page_references_only_images_that_exist_and_decode(inspected):
    from PIL import Image

    out, view, _ = inspected
    page = (view / "index.html").read_text()
    links = Links()
    links.feed(page)
    assert len(links.imgs) == SAMPLES + 2  # the samples, the sheet and the plot
    assert set(links.hrefs) == set(links.imgs)
    shards = tar_samples(out)
    for src in links.imgs:
        path = view / unquote(src)
        assert path.is_file(), f"{src} is referenced by index.html but {path} does not exist"
        with Image.open(path) as im:
            im.load()
        if src.startswith("images/"):
            stem = Path(unquote(src)).stem
            assert path.read_bytes() == shards[stem][0]  # extracted byte for byte, not re-encoded


def test_page_escapes_dataset_text_and_samples_round_robin(inspected):
    out, view, _ = inspected
    page = (view / "index.html").read_text()
    assert "<b>bold</b>" not in page and "a &lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;" in page
    links = Links()
    links.feed(page)
    shards = tar_samples(out)
    sigs = [shards[Path(unquote(s)).stem][1]["signature"] for s in links.imgs if s.startswith("images/")]
    assert len(set(sigs[:3])) == 3 and sigs[3:] == sigs[:3]  # one of each signature, then again
    assert ODD_KEY in [shards[Path(unquote(s)).stem][1]["key"] for s in links.imgs if s.startswith("images/")]


def test_contact_sheet_has_one_tile_per_sample_in_order(inspected):
    from PIL import Image

    from jobs.look.contact_sheet import SheetLayout, fit

    out, view, _ = inspected
    layout = SheetLayout()
    sheet = Image.open(view / "contact_sheet.png").convert("RGB")
    assert sheet.size == layout.size(SAMPLES) == (SAMPLES * layout.tile[0], layout.tile[1])
    links = Links()
    links.feed((view / "index.html").read_text())
    images = [view / unquote(s) for s in links.imgs if s.startswith("images/")]
    for i, path in enumerate(images):  # 64x64 squares fill their thumbnail box exactly
        expected = fit(Image.open(path), layout.thumb)
        assert sheet.crop(layout.thumb_box(i, SAMPLES)).tobytes() == expected.tobytes(), f"tile {i}"


def test_throughput_plot_shows_each_signature_and_the_captures(inspected):
    from PIL import Image

    from jobs.look.throughput_plot import CAPTURE, PALETTE, RELEASE, PlotLayout

    _, view, _ = inspected
    plot = Image.open(view / "throughput.png").convert("RGB")
    layout = PlotLayout()
    assert plot.size == (layout.width, layout.height)
    plot_area = plot.crop((0, 0, layout.width - layout.right, layout.height))  # the axes, left of the legend
    colours = {c for _, c in plot_area.getcolors(1 << 20)}
    assert set(PALETTE[:3]) | {CAPTURE, RELEASE} <= colours and PALETTE[3] not in colours


def summary_on_page(view: Path) -> list:
    page = (view / "index.html").read_text()
    found = re.search(r'<pre class="summary">(.*?)</pre>', page, re.S)
    return html.unescape(found.group(1)).split("\n") if found else []


def test_page_opens_with_the_closing_summary_the_job_logged(inspected):
    out, view, _ = inspected
    logged = [line.split("] - ", 1)[1] for line in (out.parent / "job.log").read_text().splitlines() if "] - " in line]
    start = next(i for i, line in enumerate(logged) if line.startswith("bcgen complete:"))
    shown = summary_on_page(view)
    assert shown[0] == logged[start] == f"bcgen complete: 9 images written of 9 planned (0 already done) -> {out}"
    # read back from summary.json's rounded figures: the same lines, a last digit aside
    digits = re.compile(r"\d+(\.\d+)?")
    same_text = [digits.sub("#", line) for line in logged[start:start + len(shown)]]
    assert [digits.sub("#", line) for line in shown] == same_text
    assert any(line.startswith("  stages: startup ") for line in shown)
    assert any("first batch" in line and "after the process started" in line for line in shown)


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", "{}", b"\xff\xfe", '{"status": "?"}'])
def test_a_summary_that_cannot_be_read_leaves_the_page_without_one(inspected, tmp_path, caplog, damage):
    from jobs.look.report import inspect_output

    out, _, _ = inspected
    for shard in sorted(out.glob("shard-*.tar")):
        (tmp_path / shard.name).symlink_to(shard)
    (tmp_path / "summary.json").write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    caplog.set_level(logging.WARNING)
    report = inspect_output(tmp_path, tmp_path / "view", samples=3)
    assert len(report.samples) == 3 and summary_on_page(tmp_path / "view") == []
    assert f"{tmp_path / 'summary.json'} cannot be read" in caplog.text


def test_bad_output_dir_exits_2_naming_it(tmp_path, caplog):
    from jobs.inspect import main

    caplog.set_level(logging.ERROR)
    missing = tmp_path / "no-such-run"
    assert main([str(missing)]) == 2
    assert f"{missing} does not exist" in caplog.text and "output_dir of a bcgen job" in caplog.text
    caplog.clear()
    assert main([str(tmp_path)]) == 2
    assert f"{tmp_path} holds no committed shards" in caplog.text


def test_shards_without_an_index_are_read_and_a_stale_index_is_refused(inspected, tmp_path):
    from jobs.look.report import InspectError, shard_paths

    out, _, _ = inspected
    shards = sorted(out.glob("shard-*.tar"))[:2]
    for shard in shards:
        (tmp_path / shard.name).symlink_to(shard)
    assert [p.name for p in shard_paths(tmp_path)] == [s.name for s in shards]
    (tmp_path / "index.wids.json").write_text(json.dumps({"shardlist": [{"url": "shard-000009.tar"}]}))
    with pytest.raises(InspectError, match="shard-000009.tar"):
        shard_paths(tmp_path)


def test_timeline_reader_skips_torn_lines_and_overwritten_runs(tmp_path):
    from bcg import Counters
    from jobs.telemetry.timeline import Timeline, read_timeline

    (tmp_path / "run.json").write_text('{"old": 1}')
    old = Timeline(tmp_path, "shard")
    old.start()
    old.record(4, "sigA", "eager", 4)
    old.close()
    (tmp_path / "run.json").write_text('{"new": 1}')  # job.overwrite=true replaced the run
    new = Timeline(tmp_path, "shard")
    new.start()
    new.record(2, "sigB", "replay", 2, Counters(captures=1))
    new.close()
    with open(tmp_path / "_timeline" / "shard.jsonl", "a") as f:
        f.write('{"t": 9.0, "items"')  # a kill mid-line
    entries = read_timeline(tmp_path)
    assert [(e.items, e.signature, e.captures, e.releases) for e in entries] == [(2, "sigB", 1, 0)]


def test_plot_cuts_idle_time_between_runs_and_keeps_every_image():
    from jobs.look.throughput_plot import series
    from jobs.telemetry.timeline import BatchEntry

    def e(start, t, items, sig, caps=0):
        return BatchEntry(t=t, start=start, run="r", part="shard", items=items, signature=sig, mode="replay",
                          batch_size=4, captures=caps, releases=0, evictions=0)

    # A run of 10 s, killed, resumed an hour later for 5 s; a second part alongside the first.
    entries = [e(0, 5, 20, "A", 1), e(0, 10, 20, "A", 1), e(3600, 5, 10, "B", 2),
               e(1, 4, 8, "A"), e(1, 8, 8, "A")]
    s = series(entries, bins=50)
    assert s.span == pytest.approx(15) and s.resumes == [pytest.approx(10)]
    assert s.sig_order == ["A", "B"] and s.images == 66
    width = s.span / 50
    assert sum(sum(r) for r in s.rates.values()) * width == pytest.approx(66)
    assert sum(s.rates["B"][:33]) == 0 and s.captures == [0, pytest.approx(10)]


def test_selection_is_round_robin_when_signatures_differ_in_size(tmp_path):
    import webdataset as wds
    from PIL import Image

    from jobs.look.report import select

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, format="PNG")
    layout = {"shard-000000.tar": ["A"] * 5, "shard-000001.tar": ["A"] * 3 + ["B"] * 2}
    n = 0
    for name, sigs in layout.items():
        with wds.TarWriter(str(tmp_path / name)) as tw:
            for sig in sigs:
                tw.write({"__key__": f"s{n}", "png": buf.getvalue(),
                          "json": json.dumps({"key": f"s{n}", "signature": sig}).encode()})
                n += 1
    picked = select(sorted(tmp_path.glob("shard-*.tar")), 6)
    # B has only two samples: once it runs out, A fills the rest, in shard order.
    assert [(s.key, s.meta["signature"]) for s in picked] == [
        ("s0", "A"), ("s8", "B"), ("s1", "A"), ("s9", "B"), ("s2", "A"), ("s3", "A")]
    assert [s.shard for s in picked] == ["shard-000000.tar", "shard-000001.tar"] * 2 + ["shard-000000.tar"] * 2
    assert all(s.ext == "png" and s.image == buf.getvalue() for s in picked)


def test_video_samples_are_shown_with_frames_size_fps_and_sound(tmp_path):
    """A video sample (mp4 + wav, through the sink's own encoders) and an image sample: the page
    plays the clip and the sound from byte-equal copies and names what the files hold; the sheet
    shows the clip's first frame."""
    import webdataset as wds
    from PIL import Image

    from jobs.look.contact_sheet import SheetLayout, fit
    from jobs.look.report import inspect_output
    from jobs.look.media_info import video_info
    from sinks import SinkConfig
    from sinks.audio import Audio, encode_wav
    from sinks.video import Video, encode_mp4

    g = np.random.default_rng(0)
    frames = g.integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)
    mp4 = encode_mp4(Video(frames, 12.0), "mp4", SinkConfig())
    wav = encode_wav(Audio(np.zeros((8000, 2), np.float32), 16000), "wav", SinkConfig())
    png = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 10, 10)).save(png, format="PNG")
    with wds.TarWriter(str(tmp_path / "shard-000000.tar")) as tw:
        tw.write({"__key__": "clip", "mp4": mp4, "wav": wav, "f0000.png": png.getvalue(),
                  "json": json.dumps({"key": "clip", "signature": "A"}).encode()})
        tw.write({"__key__": "still", "png": png.getvalue(), "json": json.dumps({"key": "still", "signature": "B"}).encode()})
    report = inspect_output(tmp_path, tmp_path / "view", samples=4)
    view = tmp_path / "view"
    assert [(s.key, s.ext) for s in report.samples] == [("clip", "mp4"), ("still", "png")]
    assert (view / "images/clip.mp4").read_bytes() == mp4 and (view / "images/clip.wav").read_bytes() == wav
    page = (view / "index.html").read_text()
    assert '<video src="images/clip.mp4"' in page and '<audio src="images/clip.wav"' in page
    assert "5 frames, 48x32, 12 fps; sound 0.50 s" in page and "8x6" in page
    layout = SheetLayout()
    thumb = fit(Image.fromarray(video_info(mp4).first), layout.thumb)  # 192x128, centred in its square
    left, top, _, _ = layout.thumb_box(0, 2)
    top += (layout.thumb - thumb.height) // 2
    sheet = Image.open(report.sheet).convert("RGB")
    assert sheet.crop((left, top, left + thumb.width, top + thumb.height)).tobytes() == thumb.tobytes()


def _page_links(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text())
    return links


def test_pages_walk_every_sample_and_filters_keep_what_they_say(inspected, tmp_path):
    from jobs.inspect import main

    out, _, rows = inspected
    every = tar_samples(out)
    assert main([str(out), "--out", str(tmp_path / "all"), "--pages", "--page-size", "4", "--samples", "2"]) == 0
    pages = tmp_path / "all" / "pages"
    index = _page_links(pages / "index.html")
    assert index.hrefs == ["page-0001.html", "page-0002.html", "page-0003.html"]  # 9 samples, 4 a page
    seen = []
    for i, name in enumerate(index.hrefs, 1):
        links = _page_links(pages / name)
        imgs = [unquote(s) for s in links.imgs]
        seen += imgs
        nav = [h for h in links.hrefs if h.startswith("page-") or h == "index.html"]
        expect = ([f"page-{i - 1:04d}.html"] if i > 1 else []) + ["index.html"] + ([f"page-{i + 1:04d}.html"] if i < 3 else [])
        assert nav == expect * 2  # above and below the figures
        for src in imgs:  # byte for byte the shard's member
            stem = Path(src).stem
            assert (pages / src).read_bytes() == every[stem][0]
    assert sorted(Path(s).stem for s in seen) == sorted(every)

    steps3 = {m["key"] for _, m in every.values() if "/s3/" in m["signature"]}
    assert 0 < len(steps3) < len(every)
    assert main([str(out), "--out", str(tmp_path / "s3"), "--signature", "/s3/", "--samples", "1"]) == 0
    got = {every[Path(unquote(s)).stem][1]["key"] for s in _page_links(tmp_path / "s3" / "pages" / "page-0001.html").imgs}
    assert got == steps3

    assert main([str(out), "--out", str(tmp_path / "txt"), "--text", "BOLD", "--samples", "1"]) == 0
    got = [every[Path(unquote(s)).stem][1]["prompt"] for s in _page_links(tmp_path / "txt" / "pages" / "page-0001.html").imgs]
    assert got == [MARKUP]

    assert main([str(out), "--out", str(tmp_path / "nan"), "--flag", "nonfinite", "--samples", "1"]) == 0
    assert "0 samples match (flag &#x27;nonfinite&#x27;)" in (tmp_path / "nan" / "pages" / "index.html").read_text()
    assert main([str(out), "--flag", "nan"]) == 2  # names the choices


def _files(folder: Path) -> set:
    return {str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()}


def test_a_second_look_into_a_folder_replaces_its_own_files_and_no_others(inspected, tmp_path):
    """Pages of 9 samples, then of the one the filter keeps, into the same --out: the second leaves no page
    or image of the first (page-0005.html, 8 images of samples it does not show were left there), and the
    gallery keeps the images of its 2 samples, not the first look's 6. Someone's own files stay, and so do
    files a hand-edited record names outside the folder. A look that fails midway removes nothing; the
    next complete one removes what both wrote."""
    from jobs.inspect import main

    out, _, _ = inspected
    every = tar_samples(out)
    view = tmp_path / "view"
    assert main([str(out), "--out", str(view), "--pages", "--page-size", "2", "--samples", "6"]) == 0
    pages = view / "pages"
    assert {f"page-000{i}.html" for i in range(1, 6)} <= _files(pages)
    assert len(list((pages / "images").iterdir())) == 9 and len(list((view / "images").iterdir())) == 6
    (pages / "notes.txt").write_text("mine")  # a person's own files, in both folders
    (view / "images" / "mine.jpg").write_bytes(b"mine")
    (tmp_path / "outside.txt").write_text("not inspect's")
    with open(pages / ".inspect-files", "a") as record:  # a hand edit: never followed out of the folder
        record.write(f"../../outside.txt\n{tmp_path / 'outside.txt'}\n")

    (stem,) = [s for s, (_, m) in every.items() if m["prompt"] == MARKUP]
    assert main([str(out), "--out", str(view), "--text", "BOLD", "--samples", "2"]) == 0
    assert _files(pages) == {"index.html", "page-0001.html", f"images/{stem}.jpg", "notes.txt", ".inspect-files"}
    assert (tmp_path / "outside.txt").read_text() == "not inspect's"
    assert len(list((view / "images").iterdir())) == 2 + 1 and (view / "images" / "mine.jpg").read_bytes() == b"mine"
    assert not [n for n in (view / ".inspect-files").read_text().splitlines() if n.startswith("pages/")]

    # A look that fails after writing some pages (an image's name is taken by a folder): every page it and
    # the look before wrote stays, until a complete look replaces them.
    blocker = pages / "images" / f"{list(every)[-1]}.jpg"  # the last in shard order
    blocker.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    failed = subprocess.run([sys.executable, "-m", "jobs.inspect", str(out), "--out", str(view), "--pages",
                             "--page-size", "1", "--samples", "1"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert failed.returncode == 1 and "IsADirectoryError" in failed.stderr
    assert "page-0008.html" in _files(pages) and f"images/{stem}.jpg" in _files(pages)
    blocker.rmdir()
    other = sorted(set(every) - {stem})[0]
    assert main([str(out), "--out", str(view), "--text", every[other][1]["key"], "--samples", "1"]) == 0
    assert _files(pages) == {"index.html", "page-0001.html", f"images/{other}.jpg", "notes.txt", ".inspect-files"}


def _damaged_copy(out: Path, to: Path) -> Path:
    """A copy of a real output's shards and index (the bookkeeping is not read by inspect)."""
    to.mkdir()
    for f in [*out.glob("shard-*.tar"), out / "index.wids.json"]:
        (to / f.name).write_bytes(f.read_bytes())
    return to


def test_damaged_outputs_are_named_with_the_fix_not_a_traceback(inspected, tmp_path, caplog):
    """A truncated shard, a sample json that does not parse: one message naming the file and jobs.verify, exit 2
    (both were tracebacks). An image that does not decode is reported on the page, as a broken clip is. An index
    that lists a shard twice shows its samples once (it failed an assertion). --out a file: named."""
    from jobs.inspect import main

    out, _, _ = inspected
    caplog.set_level(logging.INFO)
    first = sorted(out.glob("shard-*.tar"))[0].name

    cut = _damaged_copy(out, tmp_path / "cut")
    (cut / first).write_bytes((cut / first).read_bytes()[:3000])
    assert main([str(cut)]) == 2
    assert f"{cut / first} cannot be read (ReadError" in caplog.text
    assert f"the shard is damaged; `python -m jobs.verify {cut}` names every damaged file" in caplog.text

    def rewrite(path: Path, change) -> None:
        with tarfile.open(path) as tf:
            members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
        with tarfile.open(path, "w") as tf:
            for m, data in members:
                data = change(m.name, data)
                m.size = len(data)
                tf.addfile(m, io.BytesIO(data))

    bad_json = _damaged_copy(out, tmp_path / "json")
    rewrite(bad_json / first, lambda name, data: b"{not json" if name.endswith(".json") else data)
    caplog.clear()
    assert main([str(bad_json)]) == 2
    assert f"{bad_json / first}: the json of sample" in caplog.text and "does not parse" in caplog.text

    bad_image = _damaged_copy(out, tmp_path / "image")
    rewrite(bad_image / first, lambda name, data: b"\xff\xd8not a jpeg" if name.endswith(".jpg") else data)
    caplog.clear()
    assert main([str(bad_image), "--samples", "20"]) == 0
    assert "jpg does not decode" in (bad_image / "_inspect" / "index.html").read_text()

    twice = _damaged_copy(out, tmp_path / "twice")
    index = json.loads((twice / "index.wids.json").read_text())
    index["shardlist"] *= 2
    (twice / "index.wids.json").write_text(json.dumps(index))
    assert main([str(twice), "--samples", "50"]) == 0
    assert len(list((twice / "_inspect" / "images").glob("*.jpg"))) == len(tar_samples(out))

    caplog.clear()
    (tmp_path / "a-file").write_text("")
    assert main([str(out), "--out", str(tmp_path / "a-file")]) == 2
    assert f"cannot write {tmp_path / 'a-file' / 'images'}" in caplog.text and "pass --out DIR" in caplog.text
