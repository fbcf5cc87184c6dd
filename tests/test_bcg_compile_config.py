"""bcg.compile is opt-in, refuses breaks, and is part of a run's identity (it changes pixels)."""

from __future__ import annotations

import pytest
import torch

from bcg import RunnerConfig, apply_graph_runner
from jobs.plan.identity import run_identity
from tests.helpers import compose_cfg


def test_compile_with_breaks_is_refused():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="needs break_policy 'none'"):
        apply_graph_runner(model, RunnerConfig(backend="tape", compile=True), break_policy="attention")


def test_compile_is_part_of_the_run_identity():
    a = run_identity(compose_cfg(["output_dir=/tmp/x"]), "d", 1)
    b = run_identity(compose_cfg(["output_dir=/tmp/x", "bcg.compile=true"]), "d", 1)
    assert a["bcg_compile"] is False and b["bcg_compile"] is True
