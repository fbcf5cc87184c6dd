"""Every cache bcgen keeps lives under one folder, chosen by one rule (jobs/user_cache.py): the file
digests, the batch-size picks, the rates and the fused kernels' verdicts (bcg/fusions/cache.py, which
writes the rule out because bcg imports nothing of jobs)."""

from pathlib import Path

import pytest

from bcg.fusions import cache as fusion_cache
from jobs.plan import digest_cache
from jobs.telemetry import rates
from jobs.user_cache import user_cache_dir
from jobs.worker import batch_sizer

CASES = {
    "BCGEN_CACHE_DIR wins": ({"BCGEN_CACHE_DIR": "/c/own", "XDG_CACHE_HOME": "/x"}, Path("/c/own")),
    "XDG_CACHE_HOME next": ({"XDG_CACHE_HOME": "/x"}, Path("/x/bcgen")),
    "then ~/.cache": ({"HOME": "/home/u"}, Path("/home/u/.cache/bcgen")),
    "an empty variable is unset": ({"BCGEN_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": "/home/u"},
                                   Path("/home/u/.cache/bcgen")),
}


@pytest.mark.parametrize("case", CASES)
def test_every_cache_follows_the_one_rule(case, monkeypatch):
    env, want = CASES[case]
    for name in ("BCGEN_CACHE_DIR", "XDG_CACHE_HOME", "BCGEN_RATE_CACHE", "BCGEN_DIGEST_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert user_cache_dir() == want
    assert fusion_cache.cache_root() == want
    assert digest_cache.cache_file() == want / "file_digests.json"
    assert batch_sizer.cache_dir() == want / "batching"
    assert rates.rate_cache() == want / "rates.json"


def test_each_file_can_still_be_pointed_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setenv("BCGEN_RATE_CACHE", str(tmp_path / "r.json"))
    monkeypatch.setenv("BCGEN_DIGEST_CACHE", str(tmp_path / "d.json"))
    assert rates.rate_cache() == tmp_path / "r.json"
    assert digest_cache.cache_file() == tmp_path / "d.json"
    monkeypatch.setenv("BCGEN_DIGEST_CACHE", "off")
    assert digest_cache.cache_file() is None
