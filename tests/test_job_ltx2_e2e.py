"""End to end, LTX-2: the CLI with `ltx2_tiny` writes shards that webdataset and wids read back;
each item is KEY.mp4 (the row's frames and size, at the job's 24 fps) and KEY.wav (its sound: 24 kHz
stereo 16-bit PCM, the clip's duration), a row of one frame is an image with its sound; `jobs.verify`
passes and a rerun resumes with the shards' bytes unchanged.
"""

from __future__ import annotations

import io
import json
import wave

import av
import numpy as np
import pytest

from tests.helpers import compose_cfg, write_jsonl
from tests.test_job_e2e import run_cli, sha

ROWS = [
    {"key": "fox", "prompt": "a red fox barking in the snow"},  # the preset's 9 frames
    {"key": "sea", "prompt": "waves on a rocky shore at dusk", "num_frames": 5},
    {"key": "still", "prompt": "a bell ringing in a tower", "num_frames": 1},  # one frame: an image, with sound
    {"key": "owl", "prompt": "an owl hooting at night", "width": 96},
]
SIZE = {"owl": (64, 96)}
FPS, RATE = 24, 24000


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ltx2")
    data = write_jsonl(tmp / "prompts.jsonl", ROWS)
    args = ["model=ltx2_tiny", f"dataset.path={data}", f"output_dir={tmp / 'out'}", "sampling.steps=2",
            "job.progress=false", "sink.maxcount=2"]
    run_cli(*args)
    return tmp / "out", args


def read_wav(data: bytes):
    with wave.open(io.BytesIO(data)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, w.getnchannels())
        return pcm, w.getframerate(), w.getsampwidth()


def test_every_item_has_its_video_and_its_sound(job):
    import webdataset as wds
    from PIL import Image

    out, _ = job
    seen = {}
    for sample in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(sample["json"])
        seen[meta["key"]] = (meta, sample)
    assert sorted(seen) == sorted(r["key"] for r in ROWS)
    for row in ROWS:
        meta, sample = seen[row["key"]]
        frames = row.get("num_frames", 9)
        h, w = SIZE.get(row["key"], (64, 64))
        assert (meta["model"], meta["height"], meta["width"], meta["bucket"]) == ("ltx2_tiny", h, w, 1024)
        pcm, rate, width = read_wav(sample["wav"])
        assert (rate, width, pcm.shape[1]) == (RATE, 2, 2)
        assert (meta["audio_sample_rate"], meta["audio_samples"], meta["audio_channels"]) == (RATE, len(pcm), 2)
        # the clip's duration at the latent grid: L = round(frames / fps x 25) audio latents (16 kHz mel, hop
        # 160, 4x compression), 4L - 3 mel frames out of the causal audio VAE, 240 samples each from the vocoder
        latents = round(frames / FPS * 16000 / 160 / 4)
        assert len(pcm) == (4 * latents - 3) * 240 and abs(len(pcm) - frames / FPS * RATE) <= 5 * 240
        assert np.abs(pcm).max() > 0  # sound, not silence
        if frames == 1:
            assert "mp4" not in sample and Image.open(io.BytesIO(sample["jpg"])).size == (w, h)
            continue
        with av.open(io.BytesIO(sample["mp4"])) as container:
            rate_v = float(container.streams.video[0].average_rate)
            video = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        assert video.shape == (frames, h, w, 3) and rate_v == pytest.approx(FPS)
        assert (meta["num_frames"], meta["fps"]) == (frames, FPS)


def test_wids_reads_the_index_and_verify_passes(job):
    import wids

    from jobs.output.audit import verify_output

    out, _ = job
    ds = wids.ShardListDataset(str(out / "index.wids.json"), cache_dir=str(out.parent / "wids"), transformations=[])
    assert len(ds) == len(ROWS)
    for i in range(len(ds)):
        meta = json.loads(ds[i][".json"].read())
        assert len(read_wav(ds[i][".wav"].read())[0]) == meta["audio_samples"]
    report = verify_output(out)
    assert report.problems == [] and report.samples == len(ROWS)


def test_a_rerun_resumes_and_keeps_the_shards_bytes(job):
    from jobs.worker.run import run_job

    out, args = job
    before = {p.name: sha(p) for p in out.glob("shard-*.tar")}
    stats = run_job(compose_cfg(args))
    assert stats.status == "complete" and stats.items_written == 0
    assert {p.name: sha(p) for p in out.glob("shard-*.tar")} == before
