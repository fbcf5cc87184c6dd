"""On CUDA, a whole GLM-Image job with its DiT replayed from graphs writes the same PNG bytes and the
same prior digests as the same job run eager (overlapped stages, capture policy `always`): the
prior runs eagerly in both, seeded from each row, and only the DiT is graphed.

The prior's tokenizer comes from `.minilm/` on the GPU machine (in the repository, or beside it for
a worktree copied into `.wtNN/`); the tiny models are random, no weights needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import write_jsonl
from tests.test_job_e2e import run_cli

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def tokenizer_overrides() -> list:
    found = [p for p in (ROOT / ".minilm", ROOT.parent / ".minilm") if p.is_dir()]
    return [f"model.tiny.vision_language_encoder.tokenizer={found[0]}"] if found else []


def samples(out: Path) -> dict:
    import webdataset as wds

    got = {}
    for s in wds.WebDataset([str(p) for p in sorted(out.glob("shard-*.tar"))], shardshuffle=False):
        meta = json.loads(s["json"])
        got[meta["key"]] = (s["png"], meta)
    return got


def test_glm_image_job_replay_equals_eager(tmp_path):
    words = "a lighthouse on a cliff at dusk with waves and gulls".split()
    rows = [{"key": f"g{i:02d}", "prompt": " ".join(words[: 2 + i % 8])} for i in range(10)]
    rows[3]["prompt"] = "a sign that says 'OPEN'"  # another glyph length: a second signature
    rows[7]["prompt"] = "a sign that says 'SHUT'"
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    common = ["model=glm_image_tiny", f"dataset.path={data}", "sink=png", "sampling.steps=4", "model.dtype=bfloat16",
              "job.progress=false", "device=cuda", "bcg.batch_sizes=[1,2]", *tokenizer_overrides()]
    run_cli(*common, f"output_dir={tmp_path / 'graph'}", "bcg.capture=always")
    run_cli(*common, f"output_dir={tmp_path / 'eager'}", "bcg=off")
    g, e = samples(tmp_path / "graph"), samples(tmp_path / "eager")
    assert sorted(g) == sorted(e) and len(g) == 10
    for k in g:
        assert g[k][1]["prior_tokens_sha256"] == e[k][1]["prior_tokens_sha256"], f"{k}: the prior differs"
        assert g[k][0] == e[k][0], f"{k}: replayed image differs from eager"
    summary = json.loads((tmp_path / "graph" / "summary.json").read_text())
    graph = summary["graph"]
    assert graph["mode"] == "cuda" and graph["captures"] > 0 and graph["hits"] > 0 and graph["misses"] == 0, graph
    assert graph["capture_failures"] == 0 and {v[1]["mode"] for v in g.values()} == {"replay"}
