"""A sample is a function of its row at one batch shape, without the batch-invariant mode (issue 30's
cheap form). With one pool size (`bcg.batch_sizes=[4]`; `bcg.pad_short_batches`, the default, pads a
short tail with dummy rows) every batch of every stage (encode, denoise, decode) has 4 rows, so a row's
bytes rest only on kernels computing each row of a fixed shape the same way wherever it sits and
whatever sits beside it. Then the same key has the same latents (`latent_sha256`) and JPEG bytes alone
(beside its own dummies), among other neighbours at another position, in a job of 300 prompts,
partitioned 3 ways, and resumed after a kill. benchmarks/results/fixed_batch_h200.md shows the same of
SANA-1.6B's stages at batch 8 on the H200. What it does not give, and the mode does
(tests/test_job_contract.py): the same bytes at another pool.

Real jobs through the CLI on the trained sana_tiny at 64x64, 2 steps, one thread each; and Z-Image's
preset, whose one shape is one row a batch.
"""

from __future__ import annotations

import json

import pytest

from jobs.output.compare import compare_outputs
from tests.helpers import prompts, write_jsonl
from tests.test_job_contract import FAST, KEY, _all, _two_at_a_time, jsons
from tests.test_resume_kill import cli, log_of
from tests.test_scale_workers import finish, start

FIXED = [*FAST, "bcg.batch_sizes=[4]"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixed")
    eight = write_jsonl(tmp / "eight.jsonl", prompts(8))  # k005: position 1 of the second batch
    one = write_jsonl(tmp / "one.jsonl", [r for r in prompts(8) if r["key"] == KEY])  # beside 3 dummies
    shifted = write_jsonl(tmp / "shifted.jsonl", prompts(10)[3:])  # k005: position 2, beside k003, k004, k006
    many = write_jsonl(tmp / "many.jsonl", prompts(300))  # a job of 300: k005 in a plan of 75 batches
    out = {name: tmp / name for name in ("eight", "one", "shifted", "many", "part", "resumed")}
    chain = [f"dataset.path={eight}", f"output_dir={out['resumed']}", *FIXED, "sink.maxcount=3"]

    def killed_then_resumed():  # killed in its second batch, after one committed shard of 3
        return finish(start(*chain, env={"BCGEN_TEST_KILL_AT": "batch:2"})), cli(*chain)

    jobs = {name: [f"dataset.path={data}", *FIXED, f"output_dir={out[name]}"]
            for name, data in (("many", many), ("eight", eight), ("one", one), ("shifted", shifted))}
    jobs["chain"] = killed_then_resumed
    done = _two_at_a_time(jobs, env={})
    done["killed"], resumed = done.pop("chain")
    # units of 3, 3 and 2 items (k005: position 2, beside k003 and k004 and a dummy), three workers
    part = [f"dataset.path={eight}", f"output_dir={out['part']}", *FIXED, "plan.unit_items=3"]
    planned = cli(*part, module=("-m", "jobs.plan"))
    assert planned.returncode == 0, log_of(planned)
    done.update(_all({f"part{i}": start(*part, f"job.partition={i}/3") for i in range(3)}))
    return {"out": out, "done": done, "resumed": resumed}


@pytest.mark.slow
def test_every_job_ran(runs):
    for name, (rc, log) in runs["done"].items():
        assert rc == (-9 if name == "killed" else 0), f"{name}: exit {rc}\n{log}"  # killed by its own test hook
    assert runs["resumed"].returncode == 0, log_of(runs["resumed"])


@pytest.mark.slow
def test_at_one_shape_a_key_is_the_same_bytes_whatever_its_neighbours_position_partition_or_resume(runs):
    out = runs["out"]
    # keys in common with the run of eight: one (k005), shifted (k003..k007), the job of 300 (k000..k007),
    # the partitioned and resumed (all)
    for name, common in (("one", 1), ("shifted", 5), ("many", 8), ("part", 8), ("resumed", 8)):
        cmp = compare_outputs(out["eight"], out[name])
        assert not cmp.differing and len(cmp.identical) == common, (name, cmp.lines())  # latent_sha256, members
    assert compare_outputs(out["eight"], out["one"]).identical.first == (KEY,)
    # every batch of every run had the one shape
    for name in out:
        assert {m["batch_size"] for m in jsons(out[name]).values()} == {4}, name


@pytest.mark.slow
def test_the_summary_counts_the_padding_rows_one_shape_costs(runs):
    """What one shape costs a short job is said where a user reads: summary.json's `padding_rows`,
    and the closing block's batch sizes line (the rows every stage ran and the sink dropped)."""
    out, done = runs["out"], runs["done"]
    # eight: two full batches; one: its key beside 3 dummies; shifted: 7 keys, a tail of 3;
    # part: units of 3, 3 and 2, each cut alone (merged over the three parts' summaries)
    for name, padding, line in (("eight", 0, "no padding rows"), ("one", 3, "3 padding rows of 4 run (75%)"),
                                ("shifted", 1, "1 padding row of 8 run (12%)"), ("part", 4, None)):
        summary = json.loads((out[name] / "summary.json").read_text())
        assert summary["padding_rows"] == padding, (name, summary["padding_rows"])
        if line is not None:
            closing = next(x for x in done[name][1].splitlines() if "batch sizes:" in x)
            assert closing.endswith(f"; {line}"), (name, closing)
    # where a quarter of the rows or more were padding, the summary names the pool that pads nothing
    hint = "padding: 1 signature(s) for 1 items, each short tail padded to the batch size; bcg.batch_sizes=[1] pads"
    assert hint in done["one"][1], done["one"][1]
    assert all("bcg.batch_sizes=[1] pads nothing" not in done[name][1] for name in ("eight", "shifted", "many"))


@pytest.fixture(scope="module")
def z_image_runs(tmp_path_factory):
    """Z-Image's preset runs one row a batch (conf/model/z_image_tiny.yaml says why): its jobs of 8
    prompts (8 caption lengths, so 8 signatures) and of one, at the preset's own pool."""
    tmp = tmp_path_factory.mktemp("z_image")
    eight = write_jsonl(tmp / "eight.jsonl", prompts(8))
    one = write_jsonl(tmp / "one.jsonl", [r for r in prompts(8) if r["key"] == KEY])
    out = {name: tmp / name for name in ("eight", "one")}
    jobs = {name: ["model=z_image_tiny", f"dataset.path={data}", *FAST, f"output_dir={out[name]}"]
            for name, data in (("eight", eight), ("one", one))}
    return out, _two_at_a_time(jobs, env={})


@pytest.mark.slow
def test_z_image_runs_one_row_a_batch_so_nothing_is_padded(z_image_runs):
    # At the image presets' [8] these 8 keys (8 signatures) would run 64 rows; at [1] they run 8, and
    # a key alone has the bytes it has among the others.
    out, done = z_image_runs
    for name, (rc, log) in done.items():
        assert rc == 0, f"{name}: exit {rc}\n{log}"
        assert "batch sizes: [1] (configured; bcg.batch_grow=off); no padding rows" in log, log
        assert json.loads((out[name] / "summary.json").read_text())["padding_rows"] == 0
        assert {m["batch_size"] for m in jsons(out[name]).values()} == {1}
    cmp = compare_outputs(out["eight"], out["one"])
    assert not cmp.differing and cmp.identical.first == (KEY,) and len(cmp.identical) == 1, cmp.lines()
    assert len(json.loads((out["eight"] / "_plan" / "plan.json").read_text())["signatures"]) == 8


@pytest.fixture(scope="module")
def qwen_image_runs(tmp_path_factory):
    """Qwen-Image at its preset's [8]: a short prompt among 7 of other lengths (the longest ~3x its
    tokens, all in one text bucket) and alone. Its pipeline's encode_prompt pads a call to the longest
    prompt, which made the short one's bytes follow its neighbours (session 47): its family encodes one
    prompt a call."""
    tmp = tmp_path_factory.mktemp("qwen_image")
    texts = ["a red fox", "a red fox by a quiet misty lake in the morning light with an old stone bridge and trees",
             "owl", "a blue owl on a branch", "cat", "a castle on a hill under a stormy sky with lightning and rain",
             "dog", "a small boat"]
    rows = [{"key": f"q{i}", "prompt": t} for i, t in enumerate(texts)]
    eight, one = write_jsonl(tmp / "eight.jsonl", rows), write_jsonl(tmp / "one.jsonl", rows[:1])
    out = {name: tmp / name for name in ("eight", "one")}
    jobs = {name: ["model=qwen_image_tiny", f"dataset.path={data}", *FAST, f"output_dir={out[name]}"]
            for name, data in (("eight", eight), ("one", one))}
    return out, _two_at_a_time(jobs, env={})


@pytest.mark.slow
def test_a_qwen_image_prompt_is_the_same_bytes_beside_longer_prompts_as_alone(qwen_image_runs):
    out, done = qwen_image_runs
    for name, (rc, log) in done.items():
        assert rc == 0, f"{name}: exit {rc}\n{log}"
        assert {m["batch_size"] for m in jsons(out[name]).values()} == {8}, name
    assert len(json.loads((out["eight"] / "_plan" / "plan.json").read_text())["signatures"]) == 1  # one batch
    cmp = compare_outputs(out["eight"], out["one"])
    assert not cmp.differing and cmp.identical.first == ("q0",) and len(cmp.identical) == 1, cmp.lines()
