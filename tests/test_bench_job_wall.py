"""benchmarks/bench_job_wall.py reads the job's signatures back (str(Signature)) into FLOPs, and its timeline
into the batches' pace."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_job_wall import child_env, flops_per_image  # noqa: E402

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
    assert batch_pace(read_timeline(tmp_path)) == {
        "batches": 8, "first_handoff_s": 3.0, "batch_interval_s": 2.0, "excess_s": 0.5,
        "interval_by_signature_s": {"s": 2.0}, "above_steady_s": 0.5, "switches_above_s": 0.0,
        "slowest": [{"t": 9.5, "above_s": 0.5, "switch": False, "from_unix": 8.0, "to_unix": 10.5}]}
    assert batch_pace(read_timeline(tmp_path / "nothing")) == {}


def _timeline(folder: Path, entries: list) -> None:
    from jobs.output.layout import TIMELINE_DIR
    from jobs.telemetry.timeline import BatchEntry

    (folder / TIMELINE_DIR).mkdir(parents=True)
    lines = [json.dumps(asdict(BatchEntry(t=t, start=100.0, run="", part="a", items=8, signature=sig, mode="replay",
                                          batch_size=8))) for t, sig in entries]
    (folder / TIMELINE_DIR / "a.jsonl").write_text("\n".join(lines) + "\n")


def test_the_slowest_intervals_name_signature_switches_and_the_collections_inside_them(tmp_path):
    """A switch's interval is told apart from a stall of one signature, and --gc's collections are laid
    into the interval they began in (gc_pauses.py's file: [unix start, generation, seconds])."""
    from bench_job_wall import batch_pace, gc_report

    from jobs.telemetry.timeline import read_timeline

    _timeline(tmp_path, [(3.0, "s64"), (5.0, "s64"), (7.0, "s64"), (9.8, "s64"), (11.8, "s64"), (14.4, "s128"),
                         (16.4, "s128")])
    pace = batch_pace(read_timeline(tmp_path), slowest=2)
    assert (pace["above_steady_s"], pace["switches_above_s"]) == (1.4, 0.6)
    assert [(iv["t"], iv["switch"]) for iv in pace["slowest"]] == [(9.8, False), (14.4, True)]
    gc_file = tmp_path / "run.gc.json"
    gc_file.write_text(json.dumps([[50.0, 2, 0.3], [108.0, 2, 0.5], [108.5, 0, 0.001], [113.0, 1, 0.02]]))
    seen = gc_report(gc_file, read_timeline(tmp_path), {"stage_seconds": {"generate": 20.0}}, pace)
    assert [iv["gc_s"] for iv in pace["slowest"]] == [0.501, 0.02]  # 107-109.8 s and 111.8-114.4 s (unix)
    assert seen["gc_process"]["collections"] == {"0": 1, "1": 1, "2": 2}
    assert seen["gc_generate"] == {"collections": {"0": 1, "1": 1, "2": 1}, "seconds": {"0": 0.001, "1": 0.02, "2": 0.5},
                                   "longest_s": 0.5}


def test_probed_runs_a_module_or_code_as_python_would_and_records_its_collections(tmp_path):
    """probed.py runs `-m module` as `python -m` would (its __main__ block, its argv), or `-c code`, and
    gc_pauses writes every collection at exit; a failing program keeps its exit status."""
    import subprocess

    (tmp_path / "collects.py").write_text(
        "import gc, sys\nif __name__ == '__main__':\n    for _ in range(int(sys.argv[1])):\n        gc.collect(2)\n"
        "    sys.exit(int(sys.argv[2]))\n")
    probed = Path(__file__).resolve().parents[1] / "benchmarks" / "probed.py"
    out = tmp_path / "gc.json"
    env = {"BENCH_GC_FILE": str(out), "PATH": "", "PYTHONPATH": str(tmp_path)}
    subprocess.run([sys.executable, str(probed), "-m", "collects", "3", "0"], check=True, env=env)
    assert sum(1 for _, gen, s in json.loads(out.read_text()) if gen == 2 and s >= 0) >= 3
    code = "import gc, sys\nfor _ in range(int(sys.argv[1])):\n    gc.collect(2)"
    subprocess.run([sys.executable, str(probed), "-c", code, "4"], check=True, env=env)
    assert sum(1 for _, gen, s in json.loads(out.read_text()) if gen == 2 and s >= 0) >= 4
    failed = subprocess.run([sys.executable, str(probed), "-m", "collects", "0", "3"], env=env)
    assert failed.returncode == 3


def test_gpu_trace_reads_busy_time_overlap_and_gaps_from_the_device_events():
    """Two streams' kernels from a chrome trace (torch.profiler's export, microseconds): the union is the
    busy time, the streams' excess over it their overlap, and a stretch with nothing running a gap."""
    from gpu_trace import smi_summary, summarize

    def kernel(name, ts, dur, stream):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    slow = {"ph": "X", "cat": "kernel", "name": "conv", "ts": 1500, "dur": 1000,
            "args": {"stream": 13, "grid": [64, 1, 1], "registers per thread": 255, "est. achieved occupancy %": 12}}
    events = [kernel("gemm", 0, 1000, 7), kernel("gemm", 1000, 1000, 7), slow,
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 3000, "dur": 500, "args": {"stream": 13}},
              kernel("gemm", 4000, 1000, 7), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9000}]
    got = summarize(events)
    assert (got["events"], got["window_ms"], got["busy_ms"], got["overlap_ms"]) == (5, 5.0, 4.0, 0.5)
    assert got["stream_busy_ms"] == {"13": 1.5, "7": 3.0} and got["busy_fraction"] == 0.8
    assert got["gaps_over_0.1ms"] == {"count": 2, "ms": 1.0, "longest_ms": [0.5, 0.5]}
    assert got["kernels_ms"] == 4.0 and got["top"][0] == {"name": "gemm", "calls": 3, "ms": 3.0}
    launch = {"grid": [64, 1, 1], "registers per thread": 255, "est. achieved occupancy %": 12}
    assert got["stream_top"] == {"13": [{"name": "conv", "calls": 1, "ms": 1.0, "launch": launch},
                                        {"name": "Memcpy DtoH", "calls": 1, "ms": 0.5}],
                                 "7": [{"name": "gemm", "calls": 3, "ms": 3.0}]}
    assert summarize([]) == {"events": 0}
    smi = smi_summary(["1980, 3201, 650.5, 60, 100", "1755, 3201, 699.9, 62, 100", "garbage"])
    assert smi["clocks.sm"] == {"min": 1755.0, "median": 1980.0, "max": 1980.0, "samples": 2}


def test_jitter_around_the_steady_pace_nets_out_of_the_excess(tmp_path):
    """Hand-offs that alternate early and late (1.8 s, 2.2 s) lose the stage nothing: the net excess is 0,
    while the sum above the median counts every late one. Longer texts' slower pace shows per signature."""
    from bench_job_wall import batch_pace

    from jobs.telemetry.timeline import read_timeline

    gaps = [2.0, 2.2, 1.8, 2.0, 2.2, 1.8, 2.0, 2.2, 1.8, 2.0] + [2.2, 2.5]  # t64's, the switch, t300's
    times, t = [], 3.0
    for i, g in enumerate(gaps + [0.0]):
        times.append((round(t, 2), "t64" if i < 11 else "t300"))
        t += g
    _timeline(tmp_path, times)
    pace = batch_pace(read_timeline(tmp_path))
    assert pace["batch_interval_s"] == 2.0
    assert pace["interval_by_signature_s"] == {"t300": 2.5, "t64": 2.0}
    assert pace["above_steady_s"] == round(3 * 0.2 + 0.2 + 0.5, 2)  # the late ones, the switch, t300's
    assert pace["excess_s"] == round(0.2 + 0.5, 2)  # jitter nets out: the switch and t300's slower pace


def _call_json(folder: Path, commit: str, mode: str, walls: list, fpi: float, gpu: str = "g") -> Path:
    """A bench_job_wall.py JSON as one device call writes it (Results.write), its runs given."""
    from bench_job_wall import Results

    a = SimpleNamespace(family="sana", steps=20, guidance=4.5, res=1024, mode_order=[mode], out=str(folder),
                        tag="t", dir=None, cache="warm")
    meta = {"commit": commit, "family": "sana", "steps": 20, "guidance": 4.5, "cache": "warm", "date": "d",
            "gpu": gpu, "torch": "t", "command": f"call of {mode}", "lanes": {"0": [mode]}}
    results = Results(a, meta)
    results.fpi[(mode, 100)] = fpi
    for w in walls:
        results.runs.setdefault((mode, 100), []).append(
            {"wall_s": w, "items": 100, "images_per_s": 100 / (w - 5), "first_batch_s": 10.0, "batch": 8,
             "signatures": {}, "stage_seconds": {"load": 5.0}})
    folder.mkdir(parents=True, exist_ok=True)
    results.write()
    return folder / "job_wall_t.json"


def test_merge_takes_every_call_s_runs_of_one_commit_and_refuses_another_commit(tmp_path):
    from merge_job_wall import merge

    one = _call_json(tmp_path / "1", "abc1234", "bcg", [50.0], 1e14)
    two = _call_json(tmp_path / "2", "abc1234", "bcg", [40.0], 1e14)
    loop = _call_json(tmp_path / "3", "abc1234", "plain8", [60.0], 1e14)
    rows = {r["mode"]: r for r in json.loads(merge([one, two, loop], tmp_path, "m").read_text())["rows"]}
    assert rows["bcg"]["runs"] == 2 and rows["plain8"]["runs"] == 1
    assert (rows["bcg"]["wall_images_per_s_min"], rows["bcg"]["wall_images_per_s_max"]) == (2.0, 2.5)
    assert rows["bcg"]["wall_images_per_s"] == 2.25
    assert rows["bcg"]["tflops"] == round(1e14 * rows["bcg"]["images_per_s"] / 1e12, 1)
    meta = json.loads((tmp_path / "job_wall_m.json").read_text())["meta"]
    assert [m["command"] for m in meta["merged"]] == ["call of bcg", "call of bcg", "call of plain8"]
    assert meta["lanes"] == {"0": ["bcg", "plain8"]}
    other = _call_json(tmp_path / "4", "fff9999", "bcg", [45.0], 1e14)
    with pytest.raises(SystemExit, match="commit"):
        merge([one, other], tmp_path, "n")


def test_the_peak_fraction_is_of_the_boards_own_peak(tmp_path):
    """An H100 PCIe board's runs are a fraction of its 756 TFLOP/s, not of the SXM board's 989."""
    for gpu, peak in (("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 80GB HBM3", 989.0), ("none", 989.0)):
        path = _call_json(tmp_path / gpu, "abc1234", "bcg", [50.0], 1e14, gpu=gpu)
        (row,) = json.loads(path.read_text())["rows"]
        assert row["peak_fraction"] == round(row["tflops"] / peak, 4)
        assert f"peak_fraction: of {peak:g} TFLOP/s" in path.with_suffix(".md").read_text()


def test_the_pace_column_splits_a_modes_cost_into_per_batch_and_once_a_run():
    # session 46 read the invariant mode's cost this way by hand: the steady interval against the first
    # hand-off and the switches (README, a sample is a function of its row)
    from bench_job_wall import _pace

    runs = [{"batch_interval_s": 2.066, "first_handoff_s": 7.93, "switches_above_s": 4.51},
            {"batch_interval_s": 2.072, "first_handoff_s": 7.9, "switches_above_s": 3.59},
            {"batch_interval_s": 2.074, "first_handoff_s": 8.18, "switches_above_s": 3.79}]
    assert _pace(runs) == "steady 2.072, first 7.93, switches 3.79"
    assert _pace([{"load_s": 12.0}]) == ""  # the plain loop keeps no timeline
    assert _pace([{"batch_interval_s": 0.5, "first_handoff_s": None}]) == "steady 0.500"


def test_a_runs_caches_are_all_under_its_cache_folder(tmp_path):
    # --cache cold must start a run with bcgen's own verdicts and digests empty too, not only Triton's
    # and Inductor's (session 46: a "cold" run read the user's ~/.cache/bcgen).
    from jobs.user_cache import user_cache_dir

    env = child_env(None, tmp_path / "c")
    assert {env[k] for k in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "BCGEN_CACHE_DIR")} == {
        str(tmp_path / "c" / d) for d in ("triton", "inductor", "bcgen")}
    assert user_cache_dir(env) == tmp_path / "c" / "bcgen"
    assert child_env(1, tmp_path / "c")["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_fixed_costs_column_splits_the_jobs_load_by_part_medians():
    from bench_job_wall import _fixed

    runs = [{"stage_seconds": {"plan": 0.5, "load": 11.0 + i, "batch_sizing": 0.0},
             "load_seconds": {"weights": 0.5, "imports": 6.0 + i, "to_device": 1.4, "runner": 0.01}} for i in range(3)]
    runs.append({"stage_seconds": {"plan": 0.5, "load": 20.0}})  # a run summarised before load_seconds existed
    assert _fixed(runs) == "plan 0.5, load 12.5 (imports 7.0, weights 0.5, to_device 1.4), batch_sizing 0.0"


def test_the_fixed_costs_column_leads_with_the_jobs_start_up_by_part():
    # Session 49: a quarter of the first batch's wait came before the plan and no column said so.
    from bench_job_wall import _fixed

    runs = [{"stage_seconds": {"startup": 4.0 + i, "plan": 0.5, "load": 10.0},
             "startup_seconds": {"worker_imports": 2.5 + i, "interpreter": 0.6, "checks": 0.02, "compose": 0.9},
             "load_seconds": {"imports": 8.0}} for i in range(3)]
    assert _fixed(runs) == ("startup 5.0 (interpreter 0.6, compose 0.9, worker_imports 3.5), plan 0.5, "
                            "load 10.0 (imports 8.0)")


def test_the_pace_column_says_how_much_of_the_first_hand_off_was_the_devices():
    from bench_job_wall import _pace

    runs = [{"batch_interval_s": 0.556, "first_handoff_s": 3.6 + i, "switches_above_s": 1.5,
             "first_batch_ms": {"encode": 100.0 + i, "denoise": 600.0, "decode": 200.0}} for i in range(3)]
    runs.append({"batch_interval_s": 0.556, "first_handoff_s": 4.6})  # a summary before first_batch_ms
    assert _pace(runs) == ("steady 0.556, first 4.60 (device: encode 0.10, denoise 0.60, decode 0.20), "
                           "switches 1.50")


@pytest.mark.slow
def test_the_warm_up_meets_every_text_bucket_of_the_timed_prompts(tmp_path):
    """--warmup N takes its prompts from every unit the job plans the timed set into: the first N prompts
    met one of four text buckets at 1,000 prompts (session 53), leaving three to compile in the timed run."""
    import os
    import subprocess

    from bench_job_wall import spread_prompts

    from jobs.models.text_encoders import minilm_path

    root = Path(__file__).resolve().parents[1]
    model = tmp_path / "sana"
    subprocess.run([sys.executable, str(root / "benchmarks" / "bench_job_realsize.py"), "build", "--tiny",
                    "--dir", str(model), "--tokenizer", minilm_path()], cwd=root, check=True, capture_output=True)
    words = "a misty forest river at dawn with an old stone castle"
    lengths = [3] * 12 + [12] * 2 + [24] * 2  # about 30, 130 and 260 tokens: three text buckets, the first 12 short
    timed = tmp_path / "prompts.jsonl"
    timed.write_text("".join(json.dumps({"key": f"w{i:06d}", "prompt": " ".join([words] * n)}) + "\n"
                             for i, n in enumerate(lengths)))
    a = SimpleNamespace(work=tmp_path / "work", family="sana", dir=model, res=64, steps=2, guidance=4.5,
                        extra=["model.dtype=float32"])
    a.work.mkdir()
    env = dict(child_env(None, a.work / "cache"), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    warm = [json.loads(line) for line in spread_prompts(a, timed, 6, env).read_text().splitlines()]
    chosen = {int(r["key"][1:]) for r in warm}
    assert {lengths[i] for i in chosen} == {3, 12, 24}, chosen  # every bucket, where the first 6 meet one
    rows = [json.loads(line) for line in timed.read_text().splitlines()]
    assert len(chosen) == 6 and all(r == rows[int(r["key"][1:])] for r in warm)  # the timed set's own rows


def test_a_modes_last_job_output_is_found_among_one_folder_a_mode_and_one_a_run(tmp_path):
    """--bytes-against compares each mode's last finished output: `out-<mode>-<prompts>` (--lanes modes) or
    `out-<mode>-<prompts>-<run>` (--lanes runs), never another mode's or another prompt count's folder."""
    import os

    from bench_job_wall import last_out

    a = SimpleNamespace(work=tmp_path)
    for name, t in (("out-bcg-100-0", 1), ("out-bcg-100-1", 3), ("out-bcg-1000", 5), ("out-bcg-variant-100", 6),
                    ("out-off-100", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text("{}")
        os.utime(tmp_path / name / "summary.json", ns=(t * 10**9, t * 10**9))
    (tmp_path / "out-bcg-100-2").mkdir()  # a run that never finished
    assert last_out(a, "bcg", 100) == tmp_path / "out-bcg-100-1"
    assert last_out(a, "off", 100) == tmp_path / "out-off-100"
    assert last_out(a, "bcg-variant", 100) == tmp_path / "out-bcg-variant-100"
    assert last_out(a, "bcg-fixed8", 100) is None


@pytest.mark.slow
def test_lanes_runs_runs_a_modes_runs_side_by_side_each_in_its_own_folder(tmp_path):
    """--lanes runs: two lanes take the two runs of one mode at once (a host's GPUs: 3 runs of 3 modes in
    one device call); each run writes its own output_dir, and both finish whole."""
    import os
    import subprocess

    from jobs.models.text_encoders import minilm_path

    root = Path(__file__).resolve().parents[1]
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(root / "benchmarks" / "bench_job_wall.py"), "--build", "--tiny",
           "--dir", str(tmp_path / "sana"), "--tokenizer", minilm_path(), "--device", "cpu", "--gpus", "none,none",
           "--lanes", "runs", "--res", "64", "--steps", "2", "--prompts", "3", "--modes", "bcg", "--runs", "2",
           "--extra", "model.dtype=float32", "--work", str(work), "--out", str(out), "--tag", "cpu"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "job_wall_cpu.json").read_text())
    (row,) = result["rows"]
    assert row["mode"] == "bcg" and row["runs"] == 2 and row["skipped"] is None
    runs = row["all_runs"]
    assert [r["items"] for r in runs] == [3, 3]
    (early, late) = sorted(runs, key=lambda r: r["start_unix"])
    assert late["start_unix"] < early["start_unix"] + early["wall_s"], runs  # side by side, not in series
    for i in range(2):
        summary = json.loads((work / f"out-bcg-3-{i}" / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["items_written"] == 3
    assert not (work / "out-bcg-3").exists()
    assert result["meta"]["lanes"] == {"cpu0": ["bcg"], "cpu1": ["bcg"]} and result["meta"]["lanes_take"] == "runs"
    assert "lanes (--lanes runs: each GPU took the next run of any mode, so runs went side by side): cpu0, cpu1" in (
        out / "job_wall_cpu.md").read_text()
