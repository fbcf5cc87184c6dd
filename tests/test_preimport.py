"""The model's modules import in the background while the worker plans (jobs/worker/preimport.py).

In a fresh interpreter, since the test process has long imported diffusers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r'''
import json, sys, time
from jobs.models.base import ModelFamily
from jobs.models.registry import get_family
from jobs.worker.preimport import Preimport

class Misnamed(ModelFamily):
    name = "misnamed"
    pipeline_class = "NoSuchPipeline"

before = "diffusers" in sys.modules
pre = Preimport.start(get_family("sana"))
started_in = pre.seconds  # None: still importing, the caller went on
pre.wait()
bad = Preimport.start(Misnamed())
bad.wait()  # never raises: the load imports again and reports it
print("RESULT " + json.dumps({
    "before": before, "returned_at_once": started_in is None, "error": repr(pre.error),
    "pipeline_module": "diffusers.pipelines.sana.pipeline_sana" in sys.modules,
    "encoder_module": "transformers.models.gemma2.modeling_gemma2" in sys.modules,
    "seconds": pre.seconds, "bad_error": type(bad.error).__name__}))
'''


def test_preimport_brings_the_pipeline_modules_in_without_blocking_and_swallows_a_bad_name():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert r["before"] is False  # the worker's own imports do not pull diffusers in
    assert r["returned_at_once"] and r["seconds"] > 0
    assert r["error"] == "None" and r["pipeline_module"] and r["encoder_module"]
    assert r["bad_error"] == "AttributeError"
