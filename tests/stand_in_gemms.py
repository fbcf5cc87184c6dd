"""CPU GEMMs that stand in for the invariant mode's kernels in the verdict tests (tests/test_invariant_verified.py,
tests/test_invariant_kept.py): the canonical kernel, a vendor kernel that sums the same way, and one that does not."""

from __future__ import annotations


def canonical(a, b):
    return a @ b


def same_sums(a, b):
    """Another call (torch.mm), the same sums: the vendor kernel a verdict lets run."""
    import torch

    return torch.mm(a, b)


def split_k(a, b):
    """Other sums: K in two halves, added after (fp32 rounds differently on random data)."""
    h = a.shape[1] // 2
    return a[:, :h] @ b[:h] + a[:, h:] @ b[h:]
