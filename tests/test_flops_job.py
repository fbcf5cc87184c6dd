"""A job's summary counts the FLOPs its transformer ran: jobs/models/flops/ against torch's FLOP counter over
a whole tiny job on the CPU, for every family with a rule (its text buckets, CFG rows and steps as the job
runs them, not as the rule's own tests build the inputs)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from jobs.models.flops import known_families
from tests.helpers import compose_cfg, write_jsonl

# A preset a family runs tiny, and what turns its CFG on where the preset's default is off.
TINY = {"sana": ("sana_tiny", []), "flux": ("flux_tiny", []), "qwen_image": ("qwen_image_tiny", []),
        "z_image": ("z_image_tiny", ["sampling.guidance_scale=3.0"]), "longcat_image": ("longcat_image_tiny", []),
        "wan": ("wan_tiny", []), "sana_video": ("sana_video_tiny", []), "ltx2": ("ltx2_tiny", []),
        "glm_image": ("glm_image_tiny", []),
        "minimax_h3": ("minimax_h3_tiny", [])}  # guidance-distilled: the job refuses CFG
# Families whose job runs no negative branch whatever the guidance (one row a step).
NO_CFG = ("flux", "minimax_h3")


def test_every_family_has_a_rule_and_is_checked_here():
    """A new family's summary must not say `counted: false`: add its rule to jobs/models/flops/ and its tiny
    preset to TINY."""
    from jobs.models.registry import known_families as families

    assert set(known_families()) == set(families()) == set(TINY)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(TINY))
def test_the_summarys_flops_are_what_the_transformer_ran(family, tmp_path):
    from jobs.worker.run import run_job

    preset, extra = TINY[family]
    words = "a red fox on a hill under a pale sky"
    rows = [{"key": "short", "prompt": "a fox"}, {"key": "long", "prompt": " ".join([words] * 6)}]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    cfg = compose_cfg([f"model={preset}", f"dataset.path={data}", f"output_dir={tmp_path / 'out'}",
                       "sampling.steps=2", "job.progress=false", "bcg.batch_sizes=[1]", *extra])
    # The math backend: attention's two products reach the counter as bmm's (tests/test_flops.py).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        stats = run_job(cfg)
    assert stats.status == "complete" and stats.items_written == 2
    transformer = type(_transformer_of(cfg)).__name__
    ran = sum(counter.get_flop_counts()[transformer].values())
    assert stats.flops["counted"], stats.flops
    assert any("/cfg" in s for s in stats.signatures) or family in NO_CFG, stats.signatures  # CFG rows counted
    counted = stats.flops["flops_per_image"] * 2
    if family == "z_image":
        # Its caption embedder pads each caption to its own multiple of 32, the negative's shorter than the
        # bucket (jobs/models/flops/z_image.py): the count is an upper bound by that linear alone.
        assert ran < counted < ran * 1.01, (ran, counted)
    else:
        assert counted == pytest.approx(ran, rel=1e-12), (stats.signatures, stats.flops)


def _transformer_of(cfg):
    """The preset's transformer class, as the job builds it (the name the counter files its FLOPs under)."""
    from jobs.models.registry import get_family

    family = get_family(cfg.model.family)
    pipe = family.build_tiny(cfg.model, torch.float32)
    return family.transformer(pipe)
