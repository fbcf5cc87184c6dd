"""`NotApplicable`: a fused plan does not cover these inputs (a layout, a dtype, a module config).

Kernels, chains and rules all raise it and the verifier catches it (eager runs, nothing fails). It
lives alone so that none of them imports another for it: kernels.py imports no chain, ops.py no
kernel at import time.
"""

from __future__ import annotations


class NotApplicable(ValueError):
    """A fused plan does not cover these inputs (layout, dtype, module config): eager runs."""


def check(ok: bool, why: str) -> None:
    """Raise NotApplicable(why) unless `ok`."""
    if not ok:
        raise NotApplicable(why)
