"""`_quarantine/log.jsonl` as read back for summary.json (sinks/quarantine.py quarantine_log): a line torn by a
kill mid-append, or damaged, is left out with a warning; found in session 50, where a torn last line made the
rerun end in a traceback after all its work, before it wrote summary.json."""

from __future__ import annotations

import json
import logging

from sinks.quarantine import QUARANTINE_DIR, QUARANTINE_LOG, quarantine_log


def test_a_torn_or_damaged_line_is_left_out_and_the_others_are_read(tmp_path, caplog):
    entry = {"url": "shard-u0000000-0000.tar", "moved_to": "_quarantine/shard-u0000000-0000.tar", "reason": "r",
             "nsamples": 2}
    path = tmp_path / QUARANTINE_DIR / QUARANTINE_LOG
    path.parent.mkdir()
    good = json.dumps(entry).encode()
    path.write_bytes(b"\n".join([good, b"[1, 2]", b"\xff\xfe{", b"", good, good[: len(good) // 2]]))
    with caplog.at_level(logging.WARNING):
        assert quarantine_log(tmp_path) == [entry, entry]
    assert f"{path}: 3 line(s) are not entries" in caplog.text
    assert quarantine_log(tmp_path / "none") == []
