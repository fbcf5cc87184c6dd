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


def test_config_check_imports_no_torch():
    # The config (jobs/config.py, bcg.config) is validated before anything heavy loads: a typo costs
    # no torch import. `import bcg` is lazy for the same reason (bcg/__init__.py).
    code = ("import sys; import jobs.config, bcg, bcg.config; bcg.RunnerConfig; "
            "heavy = sorted(m for m in ('torch', 'triton', 'diffusers', 'transformers') if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def test_lossless_tier_registers_on_first_lookup():
    code = ("import sys; from bcg.rewrites import rewrite_for; assert 'bcg.fusions' not in sys.modules; "
            "install = rewrite_for('lossless'); assert install is not None and 'bcg.fusions' in sys.modules; "
            "assert rewrite_for('no-such-tier') is None")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_bcg_face_names_stay_themselves_after_every_submodule_loads():
    # A face name that is also a submodule's name turns into the module once that submodule is
    # imported (the import system sets the package attribute): `from bcg import signature` gave a
    # module in a suite whose earlier tests had loaded bcg.signature.
    code = ("import importlib, pkgutil, types, bcg; "
            "[importlib.import_module(f'bcg.{m.name}') for m in pkgutil.iter_modules(bcg.__path__) if not m.ispkg]; "
            "bad = [n for n in bcg.__all__ if isinstance(getattr(bcg, n), types.ModuleType)]; "
            "print(bad); raise SystemExit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
