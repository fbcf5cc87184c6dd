"""Runner counters: what the job writes to summary.json and shows on the progress bar."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Counters:
    hits: int = 0
    """Calls answered by a graph replay."""
    misses: int = 0
    """Calls run eagerly although graphs are on (signature not captured, capture not allowed,
    over the caps, failed before, or autograd enabled)."""
    declined: int = 0
    """Calls run eagerly because the caller's capture policy declined the signature (`bypass`)."""
    captures: int = 0
    """Signatures captured; the capturing call's output comes from its graph, so it is neither a
    hit nor a miss."""
    warmups: int = 0
    """Calls run eager on their own inputs as a signature's warm-up before its capture
    (`warmup="live"`); neither hits nor misses: the capture that follows was asked for."""
    capture_failures: int = 0
    capture_seconds: float = 0.0
    """Capture, with its random warm-up forwards (`warmup="random"`), summed over captures. Live
    warm-ups are calls of their own, not counted here."""
    segments: int = 0
    """Graph segments summed over captures (per entry: `stats()["entries"]`)."""
    graph_bytes: int = 0
    """Memory held by live entries now."""
    peak_graph_bytes: int = 0
    evictions: int = 0
    releases: int = 0
    memo_runs: int = 0
    """Replays on which a memo break (bcg.memo) re-ran: its inputs had changed."""
    memo_reuses: int = 0
    """Replays on which a memo break kept its last results (SANA: the prompt's K/V, 42 GEMMs)."""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["capture_seconds"] = round(self.capture_seconds, 4)
        return d
