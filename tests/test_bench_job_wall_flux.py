"""benchmarks/bench_job_wall.py --family flux: the job (model=flux) against a plain FluxPipeline loop,
end to end on the CPU over a tiny folder from bench_job_realsize.py build --family flux --tiny."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_job_wall import flops_per_image  # noqa: E402

from jobs.models.flops import transformer_flops  # noqa: E402
from jobs.plan import Signature  # noqa: E402


def test_flux_flops_count_one_row_whatever_the_guidance(tmp_path):
    transformer = dict(num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                       joint_attention_dim=32, pooled_projection_dim=32, in_channels=64, guidance_embeds=True)
    vae = {"block_out_channels": [8, 8, 16, 16]}
    for name, cfg in (("transformer", transformer), ("vae", vae)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    distilled = Signature(256, 256, 512, 4, 3.5, True, "bfloat16")  # what the job writes at guidance 3.5
    one_row = transformer_flops("flux", transformer, vae, Signature(256, 256, 512, 4, 3.5, False, "bfloat16"))
    got = flops_per_image(SimpleNamespace(dir=tmp_path, family="flux"), {str(distilled): 2})
    assert got == one_row.per_image


@pytest.mark.slow
def test_flux_job_and_plain_flux_pipeline_loop_on_a_tiny_folder(tmp_path):
    from jobs.models.text_encoders import minilm_path

    out, model = tmp_path / "out", tmp_path / "flux"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_job_wall.py"), "--family", "flux", "--build", "--tiny",
           "--dir", str(model), "--tokenizer", minilm_path(), "--device", "cpu", "--gpus", "none",
           "--res", "64", "--steps", "2", "--prompts", "3", "--modes", "bcg,off,plain2",
           "--work", str(tmp_path / "work"), "--out", str(out), "--tag", "cpu"]
    proc = subprocess.run([*cmd, "--runs", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = {r["mode"]: r["all_runs"] for r in json.loads((out / "job_wall_flux_cpu.json").read_text())["rows"]}
    # A second call (the device lends 10 minutes a call) keeps the first call's runs and adds run 2 of bcg
    # (--once: the reference and the plain loop stay at one run, as for a real-size model), then compares the
    # job's bytes with the first call's bcg=off output, key by key. Its --warmup runs each job mode once on 2
    # prompts first, untimed, in --work's cache (a fresh machine's first run compiles and verifies).
    proc = subprocess.run([*cmd, "--runs", "2", "--resume", "--once", "off,plain2", "--bytes-against", "off",
                           "--warmup", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bytes, bcg against off at 3 prompts: 3/3 identical" in proc.stdout
    for mode in ("bcg", "off"):  # the eager plain loop has nothing to warm
        warm = json.loads((tmp_path / "work" / f"out-warmup-{mode}" / "summary.json").read_text())
        assert warm["status"] == "complete" and warm["items_written"] == 2
    # Runs at another step count are not more runs of these: refused, naming what differs.
    other = [*cmd[:cmd.index("--steps")], "--steps", "3", *cmd[cmd.index("--steps") + 2:]]
    proc = subprocess.run([*other, "--runs", "3", "--resume"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0 and "holds runs of another setting: steps 2 there, 3 here" in proc.stderr

    index = json.loads((model / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline"
    assert index["transformer"] == ["diffusers", "FluxTransformer2DModel"]
    assert index["text_encoder_2"] == ["transformers", "T5EncoderModel"]
    assert json.loads((model / "transformer" / "config.json").read_text())["guidance_embeds"] is True

    result = json.loads((out / "job_wall_flux_cpu.json").read_text())
    assert result["meta"]["family"] == "flux" and result["meta"]["guidance"] == 3.5
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"bcg", "off", "plain2"}
    assert result["meta"]["resumed_runs"] == 3
    (first_call,) = result["meta"]["earlier_calls"]  # what the resumed runs came from, said in the table too
    assert "--runs 1" in first_call["command"] and "--resume" not in first_call["command"]
    assert f"- resumed from (--resume): {first_call['date']}" in (out / "job_wall_flux_cpu.md").read_text()
    warmed = result["meta"]["warmup"]
    assert warmed["prompts"] == 2 and set(warmed["wall_s"]) == {"bcg", "off"}
    assert all(isinstance(s, float) and s > 0 for s in warmed["wall_s"].values()), warmed
    proc = subprocess.run([*cmd, "--warmup", "2", "--cache", "cold"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "--cache cold each run starts empty: leave out --warmup" in proc.stderr
    for mode, row in rows.items():
        runs = 2 if mode == "bcg" else 1  # off and plain2 --once
        assert row["skipped"] is None and row["runs"] == runs
        assert row["all_runs"][0] == first[mode][0]  # taken over, not run again
        assert [r["items"] for r in row["all_runs"]] == [3] * runs
        assert row["wall_images_per_s"] > 0
        assert row["flops_per_image"] > 0  # jobs/models/flops/ counts Flux: both at T5's 512 tokens
    assert rows["plain2"]["all_runs"][0]["pipeline"] == "FluxPipeline"
    assert rows["bcg"]["flops_per_image"] == rows["plain2"]["flops_per_image"]
    assert rows["bcg"]["bytes_equal"] == "3/3 identical" and rows["off"]["bytes_equal"] is None
    assert (out / "job_wall_flux_cpu.md").read_text().startswith("# job_wall_flux_cpu: Flux.1-dev size, 64²")
