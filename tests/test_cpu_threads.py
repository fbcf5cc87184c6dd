"""A CPU run's identity holds its thread count (it changes bytes); a GPU run's does not."""

from __future__ import annotations

import pytest
import torch

from jobs.output.claim import open_run
from jobs.plan.identity import run_identity
from tests.helpers import compose_cfg


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def identity(device: str) -> dict:
    return run_identity(compose_cfg(["output_dir=/tmp/x", f"device={device}"]), "digest", 3)


def test_a_cpu_run_resumed_with_another_thread_count_is_refused(tmp_path, threads):
    torch.set_num_threads(2)
    first = identity("cpu")
    assert first["cpu_threads"] == 2
    open_run(tmp_path, first, overwrite=False)
    open_run(tmp_path, identity("cpu"), overwrite=False)  # same count: resumes
    torch.set_num_threads(1)
    with pytest.raises(ValueError, match="cpu_threads: 2 -> 1"):
        open_run(tmp_path, identity("cpu"), overwrite=False)


def test_a_gpu_run_leaves_the_thread_count_out(threads):
    torch.set_num_threads(1)
    one = identity("cuda")
    torch.set_num_threads(2)
    assert "cpu_threads" not in one and one == identity("cuda")
    assert ("cpu_threads" in identity("auto")) == (not torch.cuda.is_available())
