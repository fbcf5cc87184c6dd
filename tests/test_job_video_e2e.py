"""End to end, videos: the CLI with each tiny video preset writes shards that webdataset and wids
read back, and every KEY.mp4 decodes with the frames, size and fps its row asked for; a row of
one frame is an image; `jobs.verify` passes; a rerun resumes with the shards' bytes unchanged.
"""

from __future__ import annotations

import io
import json

import av
import numpy as np
import pytest

from tests.helpers import compose_cfg, write_jsonl
from tests.test_job_e2e import run_cli, sha

ROWS = [
    {"key": "fox", "prompt": "a red fox running through snow"},  # the preset's 9 frames at 16 fps
    {"key": "sea", "prompt": "waves on a rocky shore at dusk", "num_frames": 5, "fps": 8},
    {"key": "still", "prompt": "a castle on a hill", "num_frames": 1},  # one frame: an image
    {"key": "owl", "prompt": "an owl turning its head", "fps": 23.976, "width": 96},
]
SIZE = {"owl": (64, 96)}


def expected(row):
    return row.get("num_frames", 9), row.get("fps", 16), SIZE.get(row["key"], (64, 64))


@pytest.fixture(scope="module", params=["wan_tiny", "sana_video_tiny"])
def job(request, tmp_path_factory):
    preset = request.param
    tmp = tmp_path_factory.mktemp(preset)
    rows = [dict(r, width=128) if preset == "sana_video_tiny" and r["key"] == "owl" else r for r in ROWS]
    data = write_jsonl(tmp / "prompts.jsonl", rows)
    args = [f"model={preset}", f"dataset.path={data}", f"output_dir={tmp / 'out'}", "sampling.steps=2",
            "job.progress=false", "sink.maxcount=2"]
    if preset == "sana_video_tiny":
        args.append("sink.video_frames=png")  # every frame as an exact image beside the mp4
    proc = run_cli(*args)
    sizes = dict(SIZE, owl=(64, 128)) if preset == "sana_video_tiny" else SIZE
    return preset, tmp / "out", rows, sizes, args, proc


def decode(data: bytes):
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]), float(stream.average_rate)


def test_every_mp4_decodes_with_the_rows_frames_size_and_fps(job):
    import webdataset as wds
    from PIL import Image

    preset, out, rows, sizes, _, _ = job
    seen = {}
    for sample in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(sample["json"])
        seen[meta["key"]] = (meta, sample)
    assert sorted(seen) == sorted(r["key"] for r in rows)
    for row in rows:
        meta, sample = seen[row["key"]]
        frames, fps, _ = expected(row)
        h, w = sizes.get(row["key"], (64, 64))
        assert (meta["model"], meta["height"], meta["width"]) == (preset, h, w)
        if frames == 1:
            assert "mp4" not in sample and "num_frames" not in meta
            assert Image.open(io.BytesIO(sample["jpg"])).size == (w, h)
            continue
        video, rate = decode(sample["mp4"])
        assert video.shape == (frames, h, w, 3) and rate == pytest.approx(fps, abs=1e-3)
        assert (meta["num_frames"], meta["fps"]) == (frames, fps)
        assert f"/f{frames}/" in meta["signature"]
        pngs = sorted(k for k in sample if k.endswith(".png"))
        if preset == "sana_video_tiny":
            assert pngs == [f"f{i:04d}.png" for i in range(frames)]
            exact = np.stack([np.asarray(Image.open(io.BytesIO(sample[k]))) for k in pngs])
            assert exact.shape == video.shape and np.abs(exact.astype(int) - video).mean() < 8  # H.264 is lossy
        else:
            assert pngs == []


def test_wids_reads_the_index_and_verify_passes(job):
    import wids

    from jobs.output.audit import verify_output

    _, out, rows, _, _, proc = job
    ds = wids.ShardListDataset(str(out / "index.wids.json"), cache_dir=str(out.parent / "wids"), transformations=[])
    assert len(ds) == len(rows)
    keys = []
    for i in range(len(ds)):
        meta = json.loads(ds[i][".json"].read())
        keys.append(meta["key"])
        if ".mp4" in ds[i]:
            assert decode(ds[i][".mp4"].read())[0].shape[0] == meta["num_frames"]
    assert sorted(keys) == sorted(r["key"] for r in rows)
    report = verify_output(out)
    assert report.problems == [] and report.samples == len(rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["items_written"] == len(rows)
    assert summary["kinds"] == {"video": 3, "image": 1}  # "still" is one frame: an image
    assert "bcgen complete: 4 samples written (1 image, 3 videos) of 4 planned" in proc.stdout + proc.stderr


def test_a_rerun_resumes_and_keeps_the_shards_bytes(job):
    """The same command again (in this process: the CLI path ran above) generates nothing."""
    from jobs.errors import UserError
    from jobs.worker.run import run_job

    preset, out, rows, _, args, _ = job
    before = {p.name: sha(p) for p in out.glob("shard-*.tar")}
    stats = run_job(compose_cfg(args))
    assert stats.status == "complete" and stats.items_written == 0
    assert {p.name: sha(p) for p in out.glob("shard-*.tar")} == before
    # the identity records what changes a video's bytes: another crf is refused, naming it
    with pytest.raises(UserError, match="sink.video_crf: 18 -> 30"):
        run_job(compose_cfg([*args, "sink.video_crf=30"]))
