"""The planner runs no tensor op, so it imports no torch (issue 28: `import torch` was a second of a
1,000-prompt plan), nor diffusers or transformers: the families and padders keep them inside the
methods that run the model (jobs/models/base.py, padding/base.py), and the run identity's device
part is left to the first worker (jobs/plan/identity.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_jsonl

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "transformers")


def _heavy_after(code: str, *args: str) -> tuple:
    """Run `code` in a fresh interpreter; the heavy modules it imported, and its output."""
    probe = (f"import sys\ntry:\n    {code}\nfinally:\n"
             f"    print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("HEAVY ")), "HEAVY ?")
    return line[len("HEAVY "):], proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_planners_modules_import_no_torch():
    # Every family and padder, not only the ones a plan below loads: get_family imports them all.
    heavy, log = _heavy_after(
        "import jobs.plan.publish, jobs.plan.build, jobs.plan.chunk, jobs.plan.lengths, jobs.preflight, padding; "
        "from jobs.models.registry import get_family, known_families; [get_family(n) for n in known_families()]")
    assert heavy == "[]", log


@pytest.fixture(scope="module")
def sana_folder(tmp_path_factory):
    """A real-size SANA folder's layout without its weights: model_index.json, MiniLM's tokenizer as
    bcgen's real-size benchmark saves it, and the component configs planning reads (32x VAE)."""
    from jobs.models.text_encoders import load_tokenizer

    root = tmp_path_factory.mktemp("sana")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "SanaPipeline"}))
    load_tokenizer("minilm").save_pretrained(str(root / "tokenizer"))
    for name, config in (("vae", {"encoder_block_out_channels": [128, 256, 512, 512, 1024, 1024]}),
                         ("transformer", {"patch_size": 1}), ("text_encoder", None), ("scheduler", None)):
        (root / name).mkdir()
        if config is not None:
            (root / name / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize("preset", ["sana_tiny", "sana"])
def test_the_planner_cli_imports_no_torch(preset, sana_folder, tmp_path):
    """`python -m jobs.plan` on the default preset and on the real-size SANA preset (its instruction
    prefix, a diffusers folder's tokenizer): the plan is made, and none of torch, diffusers and
    transformers is imported."""
    data = write_jsonl(tmp_path / "p.jsonl", [{"key": f"k{i}", "prompt": f"a red fox {i}"} for i in range(20)])
    out = tmp_path / "out"
    extra = ["model=sana", f"model.path={sana_folder}"] if preset == "sana" else []
    heavy, log = _heavy_after("import runpy; sys.argv = ['jobs.plan'] + sys.argv[1:]; "
                              "runpy.run_module('jobs.plan', run_name='__main__')",
                              f"dataset.path={data}", f"output_dir={out}", *extra)
    assert (out / "_plan" / "plan.json").exists(), log
    assert heavy == "[]", log
    run = json.loads((out / "run.json").read_text())
    assert run["device"] == "pending" and run["provenance"]["device"] is None  # the first worker's to settle
