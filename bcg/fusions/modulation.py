"""Per-forward precompute of what every block derives from the same embedding (the modulation).

    TableStack   every block adds its own table to the same timestep embedding (SANA's
                 `scale_shift_table[None] + t.reshape(B, 6, -1)`, Wan's `scale_shift_table + temb.float()`,
                 LTX-2's six tables, two of them slices of one parameter):
                 the first block of a forward makes all the blocks' adds at once (one op, verified
                 like every chain) and the others take their slice
    SameInput    a function every block applies to the same tensor (Flux's and Qwen-Image's SiLU of
                 the timestep embedding before each block's modulation linear): once a forward

Both key on the input tensor itself (held, so its id cannot be reused) and its version counter (an
in-place edit is a miss); inference tensors (the job's torch.inference_mode) carry none, and there
identity alone is the key: diffusers makes the embedding anew in every transformer forward and
never edits it in place. A table edited in place since it was stacked (a LoRA fused) makes the
stack again.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..memo import version
from .ops import Op


class TableStack:
    """`op(tables, t, *args)` for every registered block's table at once; `one(table, t, *args)` is a
    single block's own add (for a block whose table cannot join the stack). `table`: the attribute
    holding a block's table, or a function of the block (a slice of a parameter: its version is the
    parameter's)."""

    def __init__(self, op: Op, one: Callable, table: str | Callable[[nn.Module], torch.Tensor] = "scale_shift_table"
                 ) -> None:
        self.op, self.one = op, one
        self.table: Callable[[nn.Module], torch.Tensor] = _attribute(table) if isinstance(table, str) else table
        self.blocks: list[nn.Module] = []
        self.entry: tuple | None = None

    def add(self, block: nn.Module) -> None:
        self.blocks.append(block)

    def following(self, block: nn.Module) -> nn.Module | None:
        """The block registered after this one (the model's next, in its loop), or None for the last."""
        i = next(i for i, b in enumerate(self.blocks) if b is block)
        return self.blocks[i + 1] if i + 1 < len(self.blocks) else None

    def get(self, call: Callable, block: nn.Module, t: torch.Tensor, *args: Any) -> torch.Tensor:
        if self._stale(block, t, args):
            self.entry = (t, (version(t), args), *self._make(call, block, t, args))
        assert self.entry is not None  # _stale is True while there is none
        index, out = self.entry[2], self.entry[3]
        if id(block) not in index:
            return self.one(self.table(block), t, *args)
        return out[index[id(block)][0]]

    def _stale(self, block: nn.Module, t: torch.Tensor, args: tuple) -> bool:
        e = self.entry
        if e is None or e[0] is not t or e[1] != (version(t), args):
            return True  # another forward (a new embedding), or this one edited in place
        stacked = e[2].get(id(block))
        return stacked is not None and stacked[1] != version(self.table(block))

    def _make(self, call: Callable, first: nn.Module, t: torch.Tensor, args: tuple) -> tuple:
        t0 = self.table(first)
        same = [b for b in self.blocks
                if self.table(b).shape == t0.shape and self.table(b).dtype == t0.dtype
                and self.table(b).device == t0.device]
        tables = torch.stack([self.table(b) for b in same])
        index = {id(b): (i, version(self.table(b))) for i, b in enumerate(same)}
        return index, call(self.op, tables, t, *args)


def _attribute(name: str) -> Callable[[nn.Module], torch.Tensor]:
    return lambda block: getattr(block, name)


class SameInput:
    """fn(t) once for the same tensor t (unedited), then its result again."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn
        self.entry: tuple | None = None

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        e = self.entry
        if e is None or e[0] is not t or e[1] != version(t):
            self.entry = e = (t, version(t), self.fn(t))
        return e[2]
