"""`jobs.verify --against` at size, without a model: its memory does not grow with the run.

The key table (jobs/output/key_table.py) sorts 100k keys a side into identical, differing, missing and
duplicated ones with a Python heap that stays under a few MB (the dict of every key's digests it
replaced took tens of MB there: several GB at 10M samples). Then two real outputs of 3000 samples each,
written by the sink's own ShardWriter with committed manifests, go through `python -m jobs.verify
--against` in process, and its printed lines are checked word for word.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tracemalloc
from pathlib import Path

import pytest

from jobs import verify
from jobs.errors import UserError
from jobs.output.claim import run_bytes, run_id
from jobs.output.compare import compare_outputs
from jobs.output.key_table import Keys, KeyTable
from jobs.output.layout import RUN_FILE
from sinks.config import SinkConfig
from sinks.keys import member_stem
from sinks.sample import EncodedSample
from sinks.shard_writer import Owner, ShardWriter

N = 100_000


def _bundle(key: str, salt: str = "") -> str:
    digest = hashlib.sha256((key + salt).encode()).hexdigest()
    return json.dumps({"jpg": digest, "latent_sha256": digest, "txt": digest}, sort_keys=True, separators=(",", ":"))


def _here():
    for i in range(N):
        yield f"k{i:07d}", _bundle(f"k{i:07d}"), f"shard-{i // 1000:04d}.tar"
    yield "k0000003", _bundle("copy"), "shard-9999.tar"  # read again: compared by its first copy


def _there():
    for i in range(N - 1, 9, -1):  # another order than here's: the categories come out sorted anyway
        key = f"k{i:07d}"
        yield key, _bundle(key, "other" if i % 1000 == 7 else ""), "shard-b.tar"
    for i in range(N, N + 20):
        yield f"k{i:07d}", _bundle(f"k{i:07d}"), "shard-c.tar"
    for _ in range(2):  # in three shards: two copies too many
        yield "k0050000", _bundle("k0050000"), "shard-d.tar"


def test_key_table_sorts_100k_keys_a_side_in_a_few_mb(tmp_path):
    tracemalloc.start()
    try:
        with KeyTable(tmp_path, shown=5) as table:
            assert table.add("here", _here()) == N + 1
            assert table.add("there", _there()) == N - 10 + 22
            table.seal("here")
            table.seal("there")
            differing, first = table.differing()
            got = {"identical": table.identical(), "differing": differing, "only_here": table.only("here"),
                   "only_there": table.only("there"), "dup_here": table.duplicates("here"),
                   "dup_there": table.duplicates("there")}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    diff = [f"k{i:07d}" for i in range(10, N) if i % 1000 == 7]  # k0001007 ... (k0000007 is here's only)
    assert got["differing"] == Keys(99, tuple(diff[:5]))
    assert [k for k, _, _ in first] == diff[:5] and all(a != b for _, a, b in first)
    assert got["identical"] == Keys(N - 10 - 99, ("k0000010", "k0000011", "k0000012", "k0000013", "k0000014"))
    assert got["only_here"] == Keys(10, tuple(f"k{i:07d}" for i in range(5)))
    assert got["only_there"] == Keys(20, tuple(f"k{i:07d}" for i in range(N, N + 5)))
    assert got["dup_here"] == Keys(1, ("k0000003",)) and got["dup_there"] == Keys(2, ("k0050000", "k0050000"))
    # k0000003's second copy differs, but its first is what only-here counted: not differing, not twice
    # A dict of every key's digests (what compare.py held before) peaks at about 75 MiB a side here
    assert peak < 20 * 2**20, f"peak Python memory {peak / 2**20:.1f} MiB for {N} keys a side"


def test_a_side_is_one_of_two_fixed_names(tmp_path):
    # a side's name becomes a table name in SQL text: only the two known ones get there
    with KeyTable(tmp_path) as table, pytest.raises(ValueError, match="one of"):
        table.add("here; DROP TABLE rows_here", [])


# -- two real outputs, through the sink's writer and the CLI ------------------------------------------
def _output(folder: Path, samples, shards: int = 3) -> None:
    """An output_dir as a job leaves it, minus the images: run.json, then shards committed with their
    manifests under the run's id. `samples`: (key, latent_sha256, caption) tuples."""
    folder.mkdir()
    (folder / RUN_FILE).write_bytes(run_bytes({"test": "compare_scale"}))
    samples = list(samples)
    per = -(-len(samples) // shards)
    writer = ShardWriter(folder, SinkConfig(maxcount=per), owner=Owner(run=run_id(folder)))
    for key, latent, caption in samples:
        meta = json.dumps({"key": key, "latent_sha256": latent}, sort_keys=True).encode()
        writer.write(EncodedSample(key, member_stem(key), (("txt", caption.encode()), ("json", meta))))
    writer.close()


def _latent(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scale")
    here, there = tmp / "here", tmp / "there"
    _output(here, [(f"s{i:05d}", _latent(f"s{i:05d}"), f"a prompt {i}") for i in range(3000)])
    rows = []
    for i in range(100, 3100):
        key = f"s{i:05d}"
        latent = _latent(key + "!") if i in (700, 2999) else _latent(key)  # other latents
        rows.append((key, latent, f"a prompt {i}" + (" changed" if 1500 <= i < 1507 else "")))  # other captions
    _output(there, rows)
    return here, there


def test_two_outputs_of_3000_samples_compare_key_by_key(outputs, caplog):
    here, there = outputs
    cmp = compare_outputs(here, there, scratch=here.parent)
    assert not cmp.same and len(cmp.identical) == 2900 - 9 and len(cmp.differing) == 9
    assert cmp.differs_in == {"s00700": ["latent_sha256"], **{f"s{i:05d}": ["txt"] for i in range(1500, 1504)}}
    assert sorted(p.name for p in here.parent.iterdir()) == ["here", "there"]  # the scratch database is gone
    caplog.set_level(logging.INFO, logger="jobs.verify")
    assert verify.main([str(here), "--against", str(there)]) == 1
    assert [r.getMessage() for r in caplog.records if r.name == "jobs.verify"] == [
        "identical: 2891 key(s), e.g. s00100, s00101, s00102, s00103, s00104, ...",
        "differing: 9 key(s), e.g. s00700 (latent_sha256), s01500 (txt), s01501 (txt), s01502 (txt), "
        "s01503 (txt), ...",
        f"missing from {there}: 100 key(s) that only {here} has, e.g. s00000, s00001, s00002, s00003, s00004, ...",
        f"missing from {here}: 100 key(s) that only {there} has, e.g. s03000, s03001, s03002, s03003, s03004, ...",
        f"{here} and {there} differ: 9 differing key(s), 200 missing on one side, 2891 identical",
    ]
    same = compare_outputs(here, here)
    assert same.same and same.verdict() == f"{here} and {here}: every one of 3000 key(s) identical"


def test_an_output_without_latent_digests_or_run_json_is_refused(tmp_path, outputs):
    old = tmp_path / "old"
    _output(old, [(f"s{i:05d}", "" if i >= 5 else _latent(f"s{i:05d}"), "p") for i in range(9)])
    with pytest.raises(UserError, match=r"old: 4 sample\(s\) have no latent_sha256 \(e.g. shard-000001.tar:s00005\)"):
        compare_outputs(outputs[0], old)
    with pytest.raises(UserError, match="has no run.json: it is not the output_dir of a bcgen job"):
        compare_outputs(outputs[0], tmp_path)
