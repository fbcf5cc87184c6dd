"""benchmarks/probe_import_time.py: the load's imports timed by environment, each run a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/probe_import_time.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_each_environment_gets_a_row_naming_what_it_imported(tmp_path):
    # An overlay that shadows nothing imports what the base does: same transformers, same answers.
    (tmp_path / "empty").mkdir()
    proc = probe("--runs", "1", "--out", str(tmp_path), "--tag", "t", "--overlay", f"empty={tmp_path / 'empty'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "import_time_t.json").read_text())["rows"]
    assert [r["environment"] for r in rows] == ["base", "empty"]
    import transformers

    for r in rows:
        assert r["transformers"] == transformers.__version__ and r["runs"] == 1
        assert 0 < r["import_s_min"] <= r["import_s"] <= r["import_s_max"] < 120
    assert rows[0]["sklearn_imported"] == rows[1]["sklearn_imported"]
    assert "| empty |" in (tmp_path / "import_time_t.md").read_text()


def test_an_overlay_that_names_no_folder_is_refused_by_name(tmp_path):
    proc = probe("--runs", "1", "--out", str(tmp_path), "--overlay", f"new={tmp_path / 'nowhere'}")
    assert proc.returncode == 2 and f"no folder '{tmp_path / 'nowhere'}'" in proc.stderr
    assert not list(tmp_path.glob("import_time_*"))
