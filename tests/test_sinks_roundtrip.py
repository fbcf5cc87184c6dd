"""Round trip: AsyncSink -> shards -> webdataset.WebDataset and wids.ShardListDataset.

Every key comes back exactly once with its pixels (png: exact), caption and metadata, in put
order; the same samples give byte-identical shards.
"""

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from sinks import AsyncSink, Sample, ShardWriter, SinkConfig, member_stem, scan_output, write_wids_index

KEYS = ["a.b", "../x", "a/b", "%41", "A", "ü", "tab\tkey", "x" * 150] + [f"item-{i:03d}" for i in range(17)]


def make_samples(keys=KEYS, size=(12, 10)):
    rng = np.random.default_rng(0)
    return [
        Sample(key, rng.integers(0, 256, (*size, 3), dtype=np.uint8), f"caption of {key}", {"n": i, "nested": [1.5, "x"]})
        for i, key in enumerate(keys)
    ]


def write_all(out, samples, **cfg):
    config = SinkConfig(**{"format": "png", "maxcount": 4, "encode_threads": 3, "queue_size": 3, **cfg})
    with AsyncSink(out, config) as sink:
        for sample in samples:
            sink.put(sample)
    return sink


def shard_urls(out):
    return [str(p) for p in sorted(Path(out).glob("shard-*.tar"))]


def test_webdataset_reads_every_sample_back_in_order(tmp_path):
    samples = make_samples()
    sink = write_all(tmp_path, samples)
    records = sink.records
    assert [r.nsamples for r in records] == [4, 4, 4, 4, 4, 4, 1]
    assert [r.url for r in records] == [f"shard-{i:06d}.tar" for i in range(7)]
    assert [k for r in records for k in r.keys] == KEYS

    dataset = wds.WebDataset(shard_urls(tmp_path), shardshuffle=False).decode("pil")
    got = list(dataset)
    assert [s["__key__"] for s in got] == [member_stem(k) for k in KEYS]
    for sample, read in zip(samples, got):
        assert set(read) >= {"png", "json", "txt"}
        assert read["json"] == {"key": sample.key, "n": sample.meta["n"], "nested": [1.5, "x"]}
        assert read["txt"] == sample.caption
        np.testing.assert_array_equal(np.asarray(read["png"].convert("RGB")), sample.image)


def test_wids_reads_the_index(tmp_path):
    samples = make_samples()
    sink = write_all(tmp_path, samples)
    index = write_wids_index(tmp_path, sink.records)
    doc = json.loads(index.read_text())
    assert doc["__kind__"] == "wids-shard-index-v1" and doc["wids_version"] == 1
    assert sum(s["nsamples"] for s in doc["shardlist"]) == len(samples)
    for entry in doc["shardlist"]:
        data = (tmp_path / entry["url"]).read_bytes()
        assert entry["filesize"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()

    import wids

    dataset = wids.ShardListDataset(str(index), cache_dir=str(tmp_path / "wids_cache"), transformations=[])
    assert len(dataset) == len(samples)
    for i, sample in enumerate(samples):
        read = dataset[i]
        meta = json.loads(read[".json"].read())
        assert meta["key"] == sample.key
        assert read[".txt"].read().decode() == sample.caption
        np.testing.assert_array_equal(np.asarray(Image.open(read[".png"]).convert("RGB")), sample.image)


@pytest.mark.parametrize("fmt", ["jpg", "webp"])
def test_lossy_formats_decode_close(tmp_path, fmt):
    samples = make_samples(KEYS[:5], size=(32, 32))
    for s in samples:  # smooth images, so lossy codecs stay close
        s.image = np.broadcast_to(np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None], (32, 32, 3)).copy()
    write_all(tmp_path, samples, format=fmt, quality=95)
    got = list(wds.WebDataset(shard_urls(tmp_path), shardshuffle=False).decode("rgb8"))
    assert [s["json"]["key"] for s in got] == KEYS[:5]
    for sample, read in zip(samples, got):
        assert np.abs(read[fmt].astype(int) - sample.image).mean() < 3


def test_same_samples_give_identical_bytes(tmp_path):
    samples = make_samples()
    a = write_all(tmp_path / "a", samples, encode_threads=4).records
    b = write_all(tmp_path / "b", samples, encode_threads=1).records
    assert [r.sha256 for r in a] == [r.sha256 for r in b]
    for r in a:
        assert (tmp_path / "a" / r.url).read_bytes() == (tmp_path / "b" / r.url).read_bytes()


def test_tar_headers_are_fixed(tmp_path):
    write_all(tmp_path, make_samples(KEYS[:3]))
    with tarfile.open(tmp_path / "shard-000000.tar") as tar:
        members = tar.getmembers()
    assert [m.name.split(".", 1)[1] for m in members] == ["png", "json", "txt"] * 3
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "bcgen", "bcgen", 0o444)}


def test_maxsize_rotation_keeps_shards_within_limit(tmp_path):
    samples = make_samples(size=(40, 40))  # ~5 KB png each, incompressible noise
    maxsize = 30_000
    records = write_all(tmp_path, samples, maxcount=1000, maxsize=maxsize).records
    assert len(records) > 2
    assert all(r.filesize <= maxsize for r in records)
    assert all(r.filesize == (tmp_path / r.url).stat().st_size for r in records)
    assert [k for r in records for k in r.keys] == KEYS


def test_oversized_sample_gets_its_own_shard(tmp_path):
    records = write_all(tmp_path, make_samples(KEYS[:3], size=(40, 40)), maxcount=1000, maxsize=2048).records
    assert [r.nsamples for r in records] == [1, 1, 1]


def test_commit_now_closes_the_shard_early_and_continues(tmp_path):
    samples = make_samples(KEYS[:6])
    committed = []
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=100), on_commit=committed.append) as sink:
        for s in samples[:2]:
            sink.put(s)
        first = sink.flush()
        assert first.keys == KEYS[:2] and (tmp_path / first.url).exists()
        assert sink.commit_now() is None  # nothing new since
        for s in samples[2:]:
            sink.put(s)
    assert [r.keys for r in committed] == [KEYS[:2], KEYS[2:6]]
    stats = sink.stats()
    assert stats["samples"] == 6 and stats["shards"] == 2
    assert stats["bytes"] == sum((tmp_path / r.url).stat().st_size for r in committed)
    assert stats["encode_seconds"] > 0 and stats["write_seconds"] > 0


def test_manifests_match_shards_and_scan_reloads_them(tmp_path):
    records = write_all(tmp_path, make_samples()).records
    scan = scan_output(tmp_path, verify="full")
    assert scan.records == records and scan.rebuilt == [] and scan.removed_temps == []
    stems = [r.url[:-4] for r in records]
    expected = [f"{s}{ext}" for s in stems for ext in (".parquet", ".tar", "_stats.json")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_manifest"] + sorted(expected)
    assert all([e[0] for e in r.sidecars] == [f"{r.url[:-4]}.parquet", f"{r.url[:-4]}_stats.json"] for r in records)


def test_synchronous_writer_gives_the_same_bytes(tmp_path):
    samples = make_samples()
    config = SinkConfig(format="png", maxcount=4)
    writer = ShardWriter(tmp_path / "sync", config)
    for s in samples:
        writer.write(s)
    sync = writer.close()
    threaded = write_all(tmp_path / "async", samples).records
    assert [r.sha256 for r in sync] == [r.sha256 for r in threaded]


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(image=np.zeros((4, 4), np.uint8)), r"shape \(4, 4\); expected uint8 HxWx3"),
        (dict(image=np.zeros((4, 4, 3), np.float32)), "dtype float32"),
        (dict(meta={"x": float("nan")}), "not JSON-serializable"),
        (dict(meta={"x": object()}), "not JSON-serializable"),
        (dict(meta={"key": "other"}), "differs from the sample key"),
        (dict(key=""), "non-empty strings"),
        (dict(caption=None), "caption must be a str"),
    ],
)
def test_bad_sample_raises_at_put(tmp_path, bad, message):
    fields = {"key": "k", "image": np.zeros((4, 4, 3), np.uint8), "caption": "c", "meta": {}, **bad}
    with AsyncSink(tmp_path, SinkConfig()) as sink:
        with pytest.raises(ValueError, match=message):
            sink.put(Sample(**fields))
        sink.put(Sample("good", np.zeros((4, 4, 3), np.uint8)))  # the sink stays usable
    assert [r.keys for r in sink.records] == [["good"]]


def test_duplicate_key_in_a_shard_fails_clearly(tmp_path):
    from sinks import SinkError

    sink = AsyncSink(tmp_path, SinkConfig(format="png"))
    image = np.zeros((4, 4, 3), np.uint8)
    sink.put(Sample("dup", image))
    sink.put(Sample("dup", image))
    with pytest.raises(SinkError, match="'dup' was written twice"):
        sink.close()
    assert list(tmp_path.glob("*.tar")) == [] and list(tmp_path.glob(".*.tmp")) == []
