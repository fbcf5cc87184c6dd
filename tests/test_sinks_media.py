"""Generic samples: members by extension, encoded by kind, with every guarantee image shards have.

A sample's `media` (audio, extra images, already-encoded bytes) goes into the tar next to its json
and txt; webdataset and wids read every member back; the manifest lists every member, so a resume
scan and `verify_shard` check them like an image's; a changed shard is quarantined.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import wave

import numpy as np
import pytest
import webdataset as wds

from sinks import (KINDS, AsyncSink, Audio, Sample, ShardWriter, SinkConfig, encoder_for, known_extensions,
                   member_stem, scan_output, write_wids_index)
from sinks.keys import USTAR_NAME_BYTES
from sinks.manifest import load_manifest, verify_shard
from sinks.sample import encode_sample


def tone(n=800, rate=8000, channels=1):
    t = np.arange(n) / rate
    x = 0.5 * np.sin(2 * np.pi * 440 * t)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def media_samples(n=5):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        media = {"wav": Audio(tone(400 + 100 * i, channels=1 + i % 2), 8000),
                 "depth.png": rng.integers(0, 256, (6, 8, 3), dtype=np.uint8),
                 "tokens.bin": bytes(range(i, i + 7))}
        out.append(Sample(f"m{i}", rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), f"caption {i}", {"i": i},
                          media=media))
    return out


def test_registry_covers_every_kind_and_names_the_known_on_a_miss():
    assert {encoder_for(e).kind for e in known_extensions()} == set(KINDS)
    assert encoder_for("f0003.webp").kind == "image" and encoder_for("mp4").kind == "video"
    assert known_extensions("audio") == ["wav"]
    with pytest.raises(ValueError, match="no encoder; known: .*mp4.*wav"):
        encoder_for("xyz")


def test_member_order_and_bytes(tmp_path):
    sample = media_samples(1)[0]
    enc = encode_sample(sample, SinkConfig(format="png"))
    assert [name for name, _ in enc.members()] == ["m0.png", "m0.wav", "m0.depth.png", "m0.tokens.bin", "m0.json",
                                                  "m0.txt"]
    assert dict(enc.payloads)["tokens.bin"] == bytes(range(7))  # bytes are written as they are
    with wave.open(io.BytesIO(dict(enc.payloads)["wav"])) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 8000, 400)
        pcm = np.frombuffer(w.readframes(400), "<i2")
    assert np.array_equal(pcm, np.round(tone(400) * 32767).astype(np.int16))
    # the same sample encodes to the same bytes
    assert encode_sample(sample, SinkConfig(format="png")) == enc


def test_webdataset_and_wids_read_every_member(tmp_path):
    samples = media_samples()
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=2, encode_threads=3)) as sink:
        for s in samples:
            sink.put(s)
    records = sink.records
    assert [r.nsamples for r in records] == [2, 2, 1]
    got = list(wds.WebDataset([str(tmp_path / r.url) for r in records], shardshuffle=False).decode("rgb8"))
    assert [s["json"]["key"] for s in got] == [s.key for s in samples]
    for sample, read in zip(samples, got):
        assert set(read) - {"__key__", "__url__", "__local_path__"} == {"png", "wav", "depth.png", "tokens.bin", "json",
                                                                        "txt"}
        np.testing.assert_array_equal(read["depth.png"], sample.media["depth.png"])
        assert read["tokens.bin"] == sample.media["tokens.bin"]

    import wids

    index = write_wids_index(tmp_path, records)
    ds = wids.ShardListDataset(str(index), cache_dir=str(tmp_path / "cache"), transformations=[])
    assert len(ds) == len(samples)
    for i, sample in enumerate(samples):
        read = ds[i]
        with wave.open(read[".wav"]) as w:
            assert w.getnchannels() == sample.media["wav"].samples.ndim and w.getframerate() == 8000
        assert read[".tokens.bin"].read() == sample.media["tokens.bin"]


def test_manifest_lists_media_members_and_verify_catches_a_changed_one(tmp_path):
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=10)) as sink:
        for s in media_samples(3):
            sink.put(s)
    record = load_manifest(tmp_path, sink.records[0].url)
    names = [m[0] for m in record.members]
    assert names[:6] == ["m0.png", "m0.wav", "m0.depth.png", "m0.tokens.bin", "m0.json", "m0.txt"]
    with tarfile.open(tmp_path / record.url) as tar:
        assert [[m.name, m.size] for m in tar] == record.members
    assert verify_shard(tmp_path, record, "full") == []
    # flip one byte inside the first wav's PCM: same size and headers, only sha256 sees it
    path = tmp_path / record.url
    data = bytearray(path.read_bytes())
    at = data.index(b"data", 512 * 3) + 8 + 10
    data[at] ^= 0xFF
    mtime = path.stat().st_mtime_ns
    path.write_bytes(bytes(data))
    # rewritten in place: its stamp (mtime) moved, so even the members level hashes it
    assert "sha256 differs" in verify_shard(tmp_path, record, "members")[0]
    os.utime(path, ns=(mtime, mtime))  # the same edit with the mtime put back: only sha256 sees it
    assert verify_shard(tmp_path, record, "members") == []
    assert "sha256 differs" in verify_shard(tmp_path, record, "full")[0]
    scan = scan_output(tmp_path, verify="full")
    assert scan.records == [] and scan.quarantined[0]["url"] == record.url


def test_resume_scan_rebuilds_a_media_shards_manifest_from_the_tar(tmp_path):
    writer = ShardWriter(tmp_path, SinkConfig(format="png", maxcount=2))
    for s in media_samples(3):
        writer.write(s)
    records = writer.close()
    (tmp_path / "_manifest" / f"{records[0].url}.json").unlink()
    scan = scan_output(tmp_path)
    assert scan.rebuilt == [records[0].url]
    assert [(r.url, r.keys, r.members) for r in scan.records] == [(r.url, r.keys, r.members) for r in records]


def test_long_extensions_shorten_the_stem_to_fit_the_ustar_name():
    key = "k" * 200
    frame = np.zeros((2, 2, 3), np.uint8)
    enc = encode_sample(Sample(key, media={f"f{i:04d}.webp": frame for i in range(3)}), SinkConfig())
    assert all(len(name.encode()) <= USTAR_NAME_BYTES for name, _ in enc.members())
    assert enc.stem != member_stem(key) and json.loads(dict(enc.payloads)["json"])["key"] == key
    # an image sample keeps today's stem
    assert encode_sample(Sample(key, frame), SinkConfig()).stem == member_stem(key)


@pytest.mark.parametrize("media, message", [
    ({"json": {}}, "the sample's meta already writes"),
    ({"txt": "x"}, "caption already writes"),
    ({"jpg": np.zeros((2, 2, 3), np.uint8)}, "image already writes"),
    ({".wav": Audio(tone(), 8000)}, "no leading dot"),
    ({"a/b.png": np.zeros((2, 2, 3), np.uint8)}, "no '/'"),
    ({"wav": tone()}, "must be a sinks.Audio"),
    ({"wav": Audio(tone(), 0)}, "sample_rate=0"),
    ({"wav": Audio(np.full(4, np.nan), 8000)}, "NaN or Inf"),
    ({"wav": Audio(np.zeros((4, 40)), 8000)}, r"\[N, C\]"),
    ({"depth.png": np.zeros((2, 2), np.uint8)}, "expected uint8 HxWx3"),
    ({"xyz": object()}, "has no encoder"),
    ({"extra.json": "not a dict"}, "must be a dict or list"),
])
def test_bad_media_raise_at_put_and_the_sink_stays_usable(tmp_path, media, message):
    with AsyncSink(tmp_path, SinkConfig()) as sink:
        with pytest.raises(ValueError, match=message):
            sink.put(Sample("k", np.zeros((2, 2, 3), np.uint8), media=media))
        sink.put(Sample("good", np.zeros((2, 2, 3), np.uint8)))
    assert [r.keys for r in sink.records] == [["good"]]


def test_a_sample_without_an_image_is_json_txt_and_its_media(tmp_path):
    enc = encode_sample(Sample("a", caption="c", media={"wav": Audio(tone(8), 8000)}), SinkConfig())
    assert [n for n, _ in enc.members()] == ["a.wav", "a.json", "a.txt"]
