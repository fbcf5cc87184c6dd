"""benchmarks/probe_load.py --from-log: a device call's printed run lines become the table (medians, min,
max, whether the weights matched), the run's machine and commit named, not this one's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def line(variant: str, load_s: float, checksum: int) -> str:
    return json.dumps({"variant": variant, "imports_s": 3.0, "load_s": load_s, "parts": {"to": load_s / 2},
                       "checksum": {"transformer": [checksum, "cuda:0"]}, "process_s": 9.0})


def test_the_table_is_rebuilt_from_the_printed_lines(tmp_path):
    log = tmp_path / "load.log"
    log.write_text("\n".join(["warming", line("to", 5.0, 7), line("job", 6.0, 7), line("to", 4.0, 7),
                              line("job", 8.0, 8), line("to", 9.0, 7), line("job", 7.0, 7)]) + "\n")
    subprocess.run([sys.executable, "benchmarks/probe_load.py", "--dir", str(tmp_path), "--variants", "to,job",
                    "--out", str(tmp_path / "res"), "--tag", "t", "--from-log", str(log), "--commit", "abc1234",
                    "--gpu", "NVIDIA H200", "--ran", "python3 benchmarks/probe_load.py --reps 3"],
                   cwd=ROOT, check=True, capture_output=True)
    got = json.loads((tmp_path / "res" / "load_t.json").read_text())
    to, job = got["rows"]
    assert (to["variant"], to["runs"], to["load_s"], to["load_s_min"], to["load_s_max"]) == ("to", 3, 5.0, 4.0, 9.0)
    assert (job["load_s"], job["load_s_min"], job["load_s_max"]) == (7.0, 6.0, 8.0)
    assert to["same_weights"] and job["same_weights"]  # each variant's first run's checksums against `to`'s
    assert got["meta"]["gpu"] == "NVIDIA H200" and got["meta"]["commit"] == "abc1234"
    assert "rebuilt_from" in got["meta"] and "from the run's printed lines" in (tmp_path / "res" / "load_t.md").read_text()


def test_the_jobs_load_runs_every_part_of_the_jobs_load_stage(tmp_path):
    # a tiny SANA saved as a diffusers folder, loaded on the CPU through the real preset, as the job does
    import torch

    from jobs.models.registry import get_family
    from tests.helpers import compose_cfg

    cfg = compose_cfg(["model=sana_tiny", f"output_dir={tmp_path / 'out'}"])
    get_family("sana").build_tiny(cfg.model, torch.float32).save_pretrained(tmp_path / "sana", safe_serialization=True)
    subprocess.run([sys.executable, "benchmarks/probe_load.py", "--dir", str(tmp_path / "sana"), "--device", "cpu",
                    "--reps", "1", "--variants", "job", "--out", str(tmp_path / "res"), "--tag", "t"],
                   cwd=ROOT, check=True, capture_output=True, env={**os.environ, "BENCH_COMMIT": "c0ffee1"})
    result = json.loads((tmp_path / "res" / "load_t.json").read_text())
    # the commit a device call names (its copy's git history can be stale), not the copy's HEAD
    assert result["meta"]["commit"] == "c0ffee1"
    (row,) = result["rows"]
    parts = dict(p.split(" ") for p in row["parts"].split(", "))
    # the job's "load" stage (jobs/worker/loop.py): load_pipeline (from_pretrained, the copy), the runner, the
    # decoder's rewrites; the weights frozen
    assert {"family_load", "to_device", "attach_runner", "decoder_fusions"} <= set(parts)
    assert parts["trainable_parameters"] == "0"
