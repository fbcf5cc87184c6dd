"""A pipeline's per-batch warning is said once and counted (jobs/telemetry/library_warnings.py).

Flux's CLIP reads 77 tokens and diffusers' encode_prompt warns on every batch that holds a longer
prompt, with the cut text of each row. Through the CLI with `flux_tiny` (its CLIP tokenizer capped at
77, as the real one is): the cut text never reaches the output, the reason is said once, and
summary.json and the closing summary count the batches.
"""

from __future__ import annotations

import json
import logging

from tests.helpers import tiny_pipeline, write_jsonl
from tests.test_job_e2e import run_cli

REASON = "The following part of your input was truncated because CLIP can only handle sequences up to 77 tokens"
TAIL = "zebra " * 40  # past CLIP's 77 tokens: the words diffusers' warning would print


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_clip_truncation_is_said_once_and_counted_per_batch(tmp_path):
    rows = [{"key": f"k{i}", "prompt": "a lighthouse on a cliff at dusk, " * 8 + TAIL + str(i)} for i in range(4)]
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    out = tmp_path / "out"
    proc = run_cli("model=flux_tiny", f"dataset.path={data}", f"output_dir={out}", "sampling.steps=1",
                   "sampling.height=64", "sampling.width=64", "bcg.batch_sizes=[2]", "job.progress=false")
    said = proc.stdout + proc.stderr
    assert "zebra" not in said and "[PAD]" not in said  # none of the cut text
    assert said.count(REASON) == 2  # once when said, once in the closing summary
    assert "said once, on 2 batches in all: " + REASON in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["library_warnings"] == {REASON: 2}  # 4 long prompts, batches of 2
    assert summary["items_written"] == 4


def test_other_records_pass_and_the_filter_leaves_with_the_job(caplog):
    from jobs.telemetry.library_warnings import RepeatedWarnings

    _, _, pipe = tiny_pipeline("flux_tiny")
    logger = logging.getLogger(type(pipe).__module__)
    warned = RepeatedWarnings().install(pipe)
    again = RepeatedWarnings().install(pipe)  # a later job in this process replaces the earlier filter
    assert [f for f in logger.filters if isinstance(f, RepeatedWarnings)] == [again]
    # What the logger's handlers receive: the records its filters pass. Collected here, not read from
    # stderr: diffusers' own handler writes to the stream that was sys.stderr when an earlier test
    # first configured it, which capfd does not see in a full run.
    passed = Collect()
    logger.addHandler(passed)
    try:
        with caplog.at_level(logging.WARNING):
            logger.warning("something else entirely")
            logger.warning(REASON + ": ['zebra zebra']")
            logger.warning(REASON + ": ['zebra']")
    finally:
        logger.removeHandler(passed)
    assert passed.messages == ["something else entirely"] and "zebra" not in caplog.text
    assert caplog.text.count(REASON) == 1  # said once, by the job's logger
    assert again.report() == {REASON: 2} and warned.report() == {}
    again.uninstall()
    assert not [f for f in logger.filters if isinstance(f, RepeatedWarnings)]
