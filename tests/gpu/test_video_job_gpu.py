"""On CUDA, a whole video job with graph replay writes the same frames (and the same mp4 bytes where the
host's encoder repeats itself, see `check_mp4s`; and
LTX-2's and MiniMax-H3's wav bytes) as the same job run eager, for each tiny video preset, overlapped stages and the
capture policy on.

Needs PyAV on the GPU machine (carry its wheel, e.g. av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl,
in `.whl/`); without it the test skips. The tokenizer comes from `.minilm/` there (in the repository,
or beside it for a worktree copied into `.wtNN/`); the video presets' encoders are random, no weights.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import write_jsonl
from tests.test_job_e2e import run_cli

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def tokenizer_overrides() -> list:
    found = [p for p in (ROOT / ".minilm", ROOT.parent / ".minilm") if p.is_dir()]  # a worktree copy in .wtNN/
    return [f"model.tiny.text_encoder.tokenizer={found[0]}"] if found else []


SECOND = {"minimax_h3_tiny": 141}  # a second frame count per preset (MiniMax-H3: 17k+5, 5 to 15 s at 24 fps)
SOUND = ("ltx2_tiny", "minimax_h3_tiny")


def rows(n: int, second: int = 5) -> list:
    words = "a lighthouse on a cliff at dusk with waves and gulls, oil painting, warm light".split()
    out = [{"key": f"v{i:02d}", "prompt": " ".join(words[: 2 + (i * 5) % len(words)])} for i in range(n)]
    for i, r in enumerate(out):
        if i % 3 == 1:
            r["num_frames"] = second  # a second signature
    return out


def samples(out: Path) -> dict:
    import webdataset as wds
    from PIL import Image

    got = {}
    for s in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(s["json"])
        frames = np.stack([np.asarray(Image.open(io.BytesIO(s[k]))) for k in sorted(k for k in s if k.endswith(".png"))])
        got[meta["key"]] = (frames, s["mp4"], meta, s.get("wav"))  # wav: LTX-2's and MiniMax-H3's sound
    return got


def check_mp4s(key: str, a, b) -> None:
    """Two jobs' mp4s of equal frames. Where this host's H.264 encoder gives the same bytes each time it
    encodes these frames, the jobs' bytes must be equal too. The H200 host's does not always: in
    session 20 the same frames, encoded three times in one process, gave three different files (frame
    sizes apart from the second frame on; the CPU machines tested repeat themselves), so there
    the check is what a reader gets: the same number of frames, size and rate."""
    import av

    from sinks.config import SinkConfig
    from sinks.video import Video, encode_mp4

    if a[1] == b[1]:
        return
    again = {encode_mp4(Video(a[0], float(a[2]["fps"])), "mp4", SinkConfig()) for _ in range(3)}
    keep = os.environ.get("BCG_TEST_ARTIFACTS")  # the device run's $OUT: the two files, to compare there
    if keep:
        for tag, data in (("graph", a[1]), ("eager", b[1]), ("again", next(iter(again)))):
            (Path(keep) / f"{key}.{tag}.mp4").write_bytes(data)
    where = (f"re-encoding here gave {len(again)} file(s); the graph job's equals one: {a[1] in again}, "
             f"the eager job's: {b[1] in again}; sizes {len(a[1])}, {len(b[1])}")
    assert len(again) > 1, f"{key}: equal frames and an encoder that repeats itself, but the mp4 bytes differ ({where})"

    def stream(data):
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            frames = [f for f in c.decode(s)]
            return len(frames), frames[0].width, frames[0].height, s.average_rate

    assert stream(a[1]) == stream(b[1]) == (a[2]["num_frames"], 64, 64, a[2]["fps"]), key
    print(f"\n[video gpu] {key}: mp4 bytes differ; this host's encoder does not repeat itself on these frames")


@pytest.mark.parametrize("preset", ["wan_tiny", "sana_video_tiny", "ltx2_tiny", "minimax_h3_tiny"])
def test_video_job_replay_equals_eager_frames(tmp_path, preset):
    pytest.importorskip("av", reason="PyAV is needed to write KEY.mp4; carry its wheel in .whl/")
    data = write_jsonl(tmp_path / "p.jsonl", rows(12, SECOND.get(preset, 5)))
    common = [f"model={preset}", f"dataset.path={data}", "sink.video_frames=png", "sampling.steps=4",
              "model.dtype=bfloat16", "job.progress=false", "device=cuda", "bcg.batch_sizes=[1,2]",
              *tokenizer_overrides()]
    run_cli(*common, f"output_dir={tmp_path / 'graph'}", "bcg.capture=always")
    run_cli(*common, f"output_dir={tmp_path / 'eager'}", "bcg=off")
    g, e = samples(tmp_path / "graph"), samples(tmp_path / "eager")
    assert sorted(g) == sorted(e) and len(g) == 12
    for k in g:
        assert g[k][0].shape == (g[k][2]["num_frames"], 64, 64, 3)
        assert np.array_equal(g[k][0], e[k][0]), f"{k}: replayed frames differ from eager"
        check_mp4s(k, g[k], e[k])
        assert g[k][3] == e[k][3] and (g[k][3] is not None) == (preset in SOUND), f"{k}: the sound differs"
    summary = json.loads((tmp_path / "graph" / "summary.json").read_text())
    graph = summary["graph"]
    assert graph["mode"] == "cuda" and graph["captures"] > 0 and graph["hits"] > 0 and graph["misses"] == 0, graph
    assert {v[2]["mode"] for v in g.values()} == {"replay"}
    assert summary["overlap"] is True and summary["nonfinite"] == 0
