"""Shared pytest setup: the `gpu` marker skips cleanly where CUDA is absent; every test gets its own
fusion verdict cache (bcg/fusions/cache.py), so each one compares its kernels with eager itself
instead of trusting an earlier test's (or run's) verdicts."""

import atexit
import os
import shutil
import signal
import tempfile

import pytest
import torch

# Caches bcgen keeps under the user's folder (measured batch sizes, fused-kernel checks, rates):
# one fresh folder per test session, so no test reads what another run of the suite left there,
# and the user's own ~/.cache is never touched. Subprocesses (the jobs tests start) inherit it.
os.environ["BCGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="bcgen-cache-")
atexit.register(shutil.rmtree, os.environ["BCGEN_CACHE_DIR"], True)  # one a pytest process (each xdist worker)

# A suite started in the background of a non-interactive shell (`.ci/run &`) has SIGINT ignored,
# and every job it starts inherits that: Python then installs no KeyboardInterrupt handler, so the
# Ctrl-C tests' jobs would ignore their SIGINT and finish. A terminal's Ctrl-C reaches a foreground
# job, which is what those tests stand for: give this process (so its children) the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _torch_threads_restored():
    """Some modules pin torch to one thread for their jobs (a CPU run's bytes and its run.json's
    `cpu_threads` follow the count). Restore the count at each module's end, so the next module on
    this process (xdist sends a worker several) starts from the machine's default, not a neighbour's."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _own_fusion_cache(tmp_path_factory, monkeypatch):
    from bcg.fusions.cache import ENV_DIR

    monkeypatch.setenv(ENV_DIR, str(tmp_path_factory.mktemp("bcgen-cache")))
