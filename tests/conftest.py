"""Shared pytest setup: the `gpu` marker skips cleanly where CUDA is absent."""

import os
import tempfile

import pytest
import torch

# Caches bcgen keeps under the user's folder (measured batch sizes, fused-kernel checks, rates):
# one fresh folder per test session, so no test reads what another run of the suite left there,
# and the user's own ~/.cache is never touched. Subprocesses (the jobs tests start) inherit it.
os.environ["BCGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="bcgen-cache-")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
