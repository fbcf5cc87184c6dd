"""`python -m jobs.inspect` on a real video output: a tiny LTX-2 job (clips with their sound, and a row of
one frame: an image with its sound), looked at with PyAV and, in a subprocess, without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_jsonl
from tests.test_job_e2e import ROOT, run_cli

ROWS = [
    {"key": "fox", "prompt": "a red fox barking in the snow", "num_frames": 5},
    {"key": "owl", "prompt": "an owl hooting at night", "width": 96},  # the preset's 9 frames
    {"key": "still", "prompt": "a bell ringing in a tower", "num_frames": 1},  # one frame: an image, with sound
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect_video")
    data = write_jsonl(tmp / "prompts.jsonl", ROWS)
    run_cli("model=ltx2_tiny", f"dataset.path={data}", f"output_dir={tmp / 'out'}", "sampling.steps=2",
            "job.progress=false")
    return tmp / "out"


def inspect_cli(*args: str, pythonpath: str = str(ROOT)) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-m", "jobs.inspect", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def captions(page: Path) -> dict:
    """key -> the line that says what the file holds (size; frames, fps; sound), as the page shows it."""
    import html
    import re

    found = {}
    for fig in re.findall(r"<figure>.*?</figure>", page.read_text(), flags=re.S):
        key = html.unescape(re.search(r'<div class="key">(.*?)</div>', fig).group(1))
        metas = re.findall(r'<div class="meta">(.*?)</div>', fig)
        found[key] = html.unescape(metas[0]) if len(metas) == 2 else None  # the second: signature, mode, seed
    return found


def test_without_pyav_the_look_says_pyav_is_missing_and_how_to_install_it(job, tmp_path):
    """`import av` fails (an `av` package whose import raises, first on the path): one warning naming PyAV
    and the install command; no clip is said not to decode (they all did: the tool could not read them)."""
    stub = tmp_path / "no_av" / "av"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("No module named \'av\'")\n')
    view = tmp_path / "view"
    proc = inspect_cli(str(job), "--out", str(view), "--pages",
                       pythonpath=os.pathsep.join([str(stub.parent), str(ROOT)]))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert log.count("PyAV cannot be imported here (No module named 'av')") == 1, log  # once, for both looks
    assert "pip install -e '.[video]'" in log
    for page in (view / "index.html", view / "pages" / "page-0001.html"):
        assert "does not decode" not in log and "does not decode" not in page.read_text()
        shown = captions(page)
        for key in ("fox", "owl"):
            assert shown[key].startswith("frames, size and fps not read: PyAV does not import here (pip install "
                                         "-e '.[video]'"), shown
            assert (page.parent / "images" / f"{key}.mp4").is_file()  # still extracted: the browser plays it
        assert shown["still"].startswith("64x64; sound ")  # an image needs no PyAV


def test_pages_play_each_clip_with_its_sound_and_say_what_the_files_hold(job, tmp_path):
    """The pages, as the gallery: each sample's sound extracted byte for byte and played beside its clip (or
    its one-frame image), and a caption of frames, size, fps and the sound's length. The pages read headers
    only, the gallery decodes every frame: the two captions agree."""
    import webdataset as wds

    from jobs.inspect import main

    view = tmp_path / "view"
    assert main([str(job), "--out", str(view), "--pages"]) == 0
    shards = {json.loads(s["json"])["key"]: s for s in
              wds.WebDataset([str(p) for p in sorted(job.glob("shard-*.tar"))], shardshuffle=False)}
    pages = view / "pages"
    page = (pages / "page-0001.html").read_text()
    for key, sample in shards.items():
        assert f'<audio src="images/{key}.wav"' in page
        assert (pages / "images" / f"{key}.wav").read_bytes() == sample["wav"]
    shown = captions(pages / "page-0001.html")
    assert shown == captions(view / "index.html"), (shown, captions(view / "index.html"))
    assert shown["fox"].startswith("5 frames, 64x64, 24 fps; sound 0.")
    assert shown["owl"].startswith("9 frames, 96x64, 24 fps; sound 0.")
    assert shown["still"].startswith("64x64; sound 0.")
