"""AsyncSink threading: put order is shard order whatever order encoders finish in; a slow writer
blocks put (bounded memory) instead of queueing without limit."""

import threading
import time

import numpy as np
import webdataset as wds

from sinks import AsyncSink, Sample, SinkConfig


def test_shard_order_is_put_order_when_encoders_finish_out_of_order(tmp_path):
    rng = np.random.default_rng(3)
    # Big noise images take far longer to encode than tiny ones, so with 4 threads the tiny
    # ones finish first; the writer must still write in put order.
    sizes = [256 if i % 3 == 0 else 2 for i in range(24)]
    keys = [f"s{i:02d}-{size}" for i, size in enumerate(sizes)]
    with AsyncSink(tmp_path, SinkConfig(format="png", maxcount=5, encode_threads=4, queue_size=8)) as sink:
        for key, size in zip(keys, sizes):
            sink.put(Sample(key, rng.integers(0, 256, (size, size, 3), dtype=np.uint8)))
    urls = sorted(str(p) for p in tmp_path.glob("shard-*.tar"))
    assert [s["json"]["key"] for s in wds.WebDataset(urls, shardshuffle=False).decode()] == keys
    assert [k for r in sink.records for k in r.keys] == keys


def test_slow_writer_blocks_put(tmp_path):
    queue_size, delay = 2, 0.05
    written = []
    in_flight_max = 0
    lock = threading.Lock()

    def slow_commit(record):  # runs on the writer thread: a slow disk, as far as put can tell
        written.extend(record.keys)
        time.sleep(delay)

    sink = AsyncSink(tmp_path, SinkConfig(format="png", maxcount=1, queue_size=queue_size), on_commit=slow_commit)
    image = np.zeros((4, 4, 3), np.uint8)
    for i in range(12):
        sink.put(Sample(f"k{i}", image))
        with lock:
            in_flight_max = max(in_flight_max, i + 1 - len(written))
    sink.close()
    stats = sink.stats()
    # Put waited for the writer rather than buffering everything: at most the queue, the item the
    # writer holds and the one it is committing were pending at once.
    assert in_flight_max <= queue_size + 2, in_flight_max
    assert stats["put_blocked_seconds"] > 5 * delay, stats
    assert stats["samples"] == 12 and stats["shards"] == 12
