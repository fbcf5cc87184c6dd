"""The house keeps its shape: imports point down only, checked on every run of the suite.

The contracts live in pyproject.toml ([tool.importlinter]): the planner never imports the worker,
output never imports the worker, planner or telemetry, families know no graphs, bcg's core never
imports its kernels, the leaves know no job. A wrong-way import fails here, naming the chain,
instead of waiting for a review.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 broken" in proc.stdout and " BROKEN" not in proc.stdout, proc.stdout[-2000:]
