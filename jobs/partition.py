"""Cut a sorted plan into N contiguous shares of near-equal estimated work.

Contiguous shares keep same-signature runs together (at most N-1 runs are cut, so each share
captures few graphs), and work, not item count, balances them: a 1024^2 item costs ~4x a 512^2
one. The cut is a pure function of the plan, so every rank/array task computes the same cut.
"""

from __future__ import annotations

from jobs.plan import Batch, Plan


def batch_work(b: Batch) -> float:
    s = b.signature
    # Transformer FLOPs grow ~linearly in pixels x steps x rows (x2 with CFG); good enough to balance.
    return float(s.height * s.width * s.steps * b.size * (2 if s.cfg else 1))


def take_partition(plan: Plan, index: int, count: int) -> Plan:
    assert 0 <= index < count
    if count == 1:
        return plan
    total = sum(batch_work(b) for b in plan.batches)
    lo, hi = total * index / count, total * (index + 1) / count
    mine, acc = [], 0.0
    for b in plan.batches:
        mid = acc + batch_work(b) / 2  # a batch belongs to the share holding its midpoint
        if lo <= mid < hi or (index == count - 1 and mid >= hi):
            mine.append(b)
        acc += batch_work(b)
    counts: dict = {}
    for b in mine:
        counts[b.signature] = counts.get(b.signature, 0) + len(b.items)
    return Plan(batches=mine, truncated=sum(1 for b in mine for it in b.items if it.truncated),
                signature_counts=counts)
