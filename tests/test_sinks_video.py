"""The video sink: `KEY.mp4` (H.264 through PyAV) that decodes with its frame count, size and fps,
reproducible bytes, optional per-frame images, and shards webdataset and wids read back.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import webdataset as wds

from jobs.plan import Item, Signature
from jobs.worker.samples import item_meta, item_sample
from sinks import AsyncSink, Sample, SinkConfig, Video, write_wids_index
from sinks.manifest import load_manifest, verify_shard
from sinks.sample import encode_sample

ROOT = Path(__file__).resolve().parents[1]


def clip(frames=9, h=48, w=64, seed=0):
    """Smooth moving gradients: what a lossy codec keeps close, unlike noise."""
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 6.28, 3)
    out = np.empty((frames, h, w, 3), np.uint8)
    for f in range(frames):
        for c in range(3):
            out[f, :, :, c] = 127.5 + 100 * np.sin(x / 25.0 + y / 31.0 + phase[c] + f * 0.3)
    return out


def decode(data: bytes):
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return np.stack(frames), stream.average_rate, stream.codec_context.name


@pytest.mark.parametrize("fps", [16, 24, 23.976])
def test_mp4_decodes_with_its_frame_count_size_and_fps(fps):
    frames = clip(9)
    enc = encode_sample(Sample("v", media={"mp4": Video(frames, fps)}), SinkConfig())
    decoded, rate, codec = decode(dict(enc.payloads)["mp4"])
    assert decoded.shape == frames.shape and codec == "h264"
    assert float(rate) == pytest.approx(fps, abs=1e-3)
    # crf 18 on smooth content: within a few levels (4:2:0 chroma and quantization are lossy)
    assert np.abs(decoded.astype(int) - frames).mean() < 3


def test_same_frames_give_the_same_bytes_in_another_process(tmp_path):
    frames = clip(5, seed=3)
    config = SinkConfig(video_crf=23, video_preset="fast")
    a = dict(encode_sample(Sample("v", media={"mp4": Video(frames, 16)}), config).payloads)["mp4"]
    b = dict(encode_sample(Sample("v", media={"mp4": Video(frames.copy(), 16.0)}), config).payloads)["mp4"]
    assert a == b
    np.save(tmp_path / "clip.npy", frames)
    code = ("import sys, hashlib, numpy as np; from sinks import Video, SinkConfig, Sample;"
            "from sinks.sample import encode_sample;"
            f"e = encode_sample(Sample('v', media={{'mp4': Video(np.load({str(tmp_path / 'clip.npy')!r}), 16)}}),"
            "SinkConfig(video_crf=23, video_preset='fast')); sys.stdout.write(hashlib.sha256(dict(e.payloads)['mp4']).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"})
    assert out.stdout == hashlib.sha256(a).hexdigest()
    assert b"Lavf" not in a  # bitexact muxing: no FFmpeg version string
    # the settings are the ones asked for: another crf gives other bytes
    c = dict(encode_sample(Sample("v", media={"mp4": Video(frames, 16)}), SinkConfig(video_crf=35)).payloads)["mp4"]
    assert c != a and len(c) < len(a)


def test_shards_of_videos_read_back_with_webdataset_and_wids(tmp_path):
    clips = [clip(5 + 4 * (i % 2), seed=i) for i in range(5)]
    config = SinkConfig(maxcount=2, encode_threads=2, video_frames="png")
    with AsyncSink(tmp_path, config) as sink:
        for i, frames in enumerate(clips):
            sink.put(Sample(f"v{i}", caption=f"clip {i}", meta={"num_frames": len(frames), "fps": 8.0},
                            media={"mp4": Video(frames, 8), **{f"f{j:04d}.png": f for j, f in enumerate(frames)}}))
    records = sink.records
    assert [r.nsamples for r in records] == [2, 2, 1]
    record = load_manifest(tmp_path, records[0].url)
    assert [m[0] for m in record.members][:3] == ["v0.mp4", "v0.f0000.png", "v0.f0001.png"]
    assert verify_shard(tmp_path, record, "full") == []

    got = list(wds.WebDataset([str(tmp_path / r.url) for r in records], shardshuffle=False).decode("rgb8"))
    assert [s["json"]["key"] for s in got] == [f"v{i}" for i in range(5)]
    for frames, read in zip(clips, got):
        decoded, rate, _ = decode(read["mp4"])
        assert decoded.shape == frames.shape and float(rate) == 8 == read["json"]["fps"]
        assert read["json"]["num_frames"] == len(frames)
        for j, frame in enumerate(frames):  # png frames are exact
            np.testing.assert_array_equal(read[f"f{j:04d}.png"], frame)

    import wids

    index = write_wids_index(tmp_path, records)
    ds = wids.ShardListDataset(str(index), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == 5
    for i, frames in enumerate(clips):
        read = ds[i]
        assert json.loads(read[".json"].read())["key"] == f"v{i}"
        assert decode(read[".mp4"].read())[0].shape == frames.shape


@pytest.mark.parametrize("video, message", [
    (Video(clip(3, h=47), 16), "even height and width"),
    (Video(clip(3)[..., :2], 16), r"\[F, H, W, 3\]"),
    (Video(clip(3).astype(np.float32), 16), "dtype float32"),
    (Video(clip(3), 0), "fps=0"),
    (Video(clip(3), float("nan")), "fps=nan"),
    (clip(3), "must be a sinks.Video"),
])
def test_bad_videos_raise_at_put(tmp_path, video, message):
    with AsyncSink(tmp_path, SinkConfig()) as sink:
        with pytest.raises(ValueError, match=message):
            sink.put(Sample("v", media={"mp4": video}))
    assert sink.records == []


def _item(frames, fps=12.0):
    sig = Signature(48, 64, 64, 2, 1.0, False, "float32", frames=frames)
    return Item("k", "a prompt", "", 1, sig, 3, False, "p.jsonl:1", fps=fps)


def test_an_item_becomes_an_image_or_a_video_sample():
    video = clip(9)
    it = _item(9)
    meta = item_meta(it, "m", "eager", 1, True, "0" * 64)
    assert (meta["num_frames"], meta["fps"], meta["signature"]) == (9, 12.0, "48x64/f9/t64/s2/nocfg/float32")
    sample = item_sample(it, video, meta, SinkConfig(video_frames="webp"))
    assert sample.image is None and list(sample.media) == ["mp4"] + [f"f{i:04d}.webp" for i in range(9)]
    assert sample.media["mp4"].fps == 12.0 and sample.media["mp4"].frames is video
    assert list(item_sample(it, video, meta, SinkConfig()).media) == ["mp4"]
    # one frame is an image, from an image family ([H, W, 3]) or a video family ([1, H, W, 3])
    one = _item(1)
    meta1 = item_meta(one, "m", "eager", 1, True, "0" * 64)
    assert "num_frames" not in meta1 and "fps" not in meta1
    for pixels in (video[0], video[:1]):
        s = item_sample(one, pixels, meta1, SinkConfig(video_frames="webp"))
        assert s.media == {} and s.image.shape == (48, 64, 3)
