"""benchmarks/bench_job_wall.py reads the job's signatures back (str(Signature)) into FLOPs, and its timeline
into the batches' pace."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_job_wall import flops_per_image  # noqa: E402

from jobs.models.flops import transformer_flops  # noqa: E402
from jobs.plan import Signature  # noqa: E402


def test_flops_per_image_is_the_mean_over_the_runs_signatures(tmp_path):
    transformer = {"num_layers": 2, "num_attention_heads": 4, "attention_head_dim": 16}
    vae = {"encoder_block_out_channels": [8] * 6}
    for name, cfg in (("transformer", transformer), ("vae", vae)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    a = Signature(1024, 1024, 64, 20, 4.5, True, "bfloat16")
    b = Signature(512, 768, 300, 8, 1.0, False, "bfloat16")
    want = [transformer_flops("sana", transformer, vae, s).per_image for s in (a, b)]
    got = flops_per_image(SimpleNamespace(dir=tmp_path), {str(a): 3, str(b): 1})
    assert got == (3 * want[0] + want[1]) / 4
    assert flops_per_image(SimpleNamespace(dir=tmp_path), {"not a signature": 1}) is None


def test_batch_pace_reads_a_steady_interval_and_the_time_above_it(tmp_path):
    """Two parts' timelines (jobs/telemetry/timeline.py's file format): the steady interval is the median
    of the intervals within each part, and what a capture or a stall added shows above it."""
    from bench_job_wall import batch_pace

    from jobs.output.layout import TIMELINE_DIR
    from jobs.telemetry.timeline import BatchEntry, read_timeline

    folder = tmp_path / TIMELINE_DIR
    folder.mkdir()
    ts = {"a": [3.0, 5.0, 7.0, 9.5, 11.5], "b": [4.0, 6.0, 8.0]}  # part a: one interval 0.5 s slow
    for part, times in ts.items():
        lines = [json.dumps(asdict(BatchEntry(t=t, start=1.0, run="", part=part, items=8, signature="s", mode="replay",
                                       batch_size=8))) for t in times]
        (folder / f"{part}.jsonl").write_text("\n".join(lines) + "\n")
    assert batch_pace(read_timeline(tmp_path)) == {"batches": 8, "first_handoff_s": 3.0, "batch_interval_s": 2.0,
                                                   "above_steady_s": 0.5}
    assert batch_pace(read_timeline(tmp_path / "nothing")) == {}
