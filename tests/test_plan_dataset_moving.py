"""A dataset file that changes while it is planned (a writer still appending) is refused.

plan.json records each file's size and mtime, and a rerun trusts a file whose stamp is unchanged. Taken
after the read, the stamp of a file that grew meanwhile would vouch for rows the plan never read: those rows
would never be planned, by a rerun or by job.extend. A real writer thread appends rows for the whole plan.
"""

from __future__ import annotations

import threading
import time

import pytest

from jobs.dataset import DatasetError
from jobs.plan.__main__ import plan_typed
from tests.helpers import compose_cfg


def _appending(path, line: str, stop: threading.Event, wrote: threading.Event) -> None:
    while not stop.is_set():
        with open(path, "a", encoding="utf-8") as f:  # one small append a row: never half a row on disk
            f.write(line)
        wrote.set()
        time.sleep(0.001)


@pytest.mark.parametrize("name, row", [("rows.jsonl", '{{"prompt": "prompt {}"}}\n'), ("rows.txt", "prompt {}\n")])
def test_a_dataset_written_while_it_is_planned_is_refused_and_nothing_is_planned(tmp_path, name, row):
    data, out = tmp_path / name, tmp_path / "out"
    data.write_text("".join(row.format(i) for i in range(2000)))  # JSONL: the Arrow lane; TXT: the row readers
    args = [f"dataset.path={data}", f"output_dir={out}"]
    stop, wrote = threading.Event(), threading.Event()
    writer = threading.Thread(target=_appending, args=(data, row.format("late"), stop, wrote), daemon=True)
    writer.start()
    assert wrote.wait(10)
    try:
        with pytest.raises(DatasetError, match=rf"dataset.path: {data} changed while it was planned \(\d+ -> \d+ "
                                               r"bytes.*something is still writing it. Nothing was planned"):
            plan_typed(compose_cfg(args))
    finally:
        stop.set()
        writer.join(10)
    assert not (out / "_plan" / "plan.json").exists()
    plan_typed(compose_cfg(args))  # written whole: planned
    assert (out / "_plan" / "plan.json").exists()
