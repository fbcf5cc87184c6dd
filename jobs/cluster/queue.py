"""The units a Ray driver has left to hand out, in the order one worker would lease them.

    take(warm)     a unit a dead actor left unfinished first (it is on the job's critical path),
                   else one of the signature the asking actor has warm (its graphs stay captured),
                   else the costliest (longest-processing-time-first balances the tail)
    put_back(u)    a unit whose actor died, or stopped before finishing it

O(log n) a take: one heap over all units and one per signature share their entries, and a unit
taken from one heap is skipped in the other (lazy deletion). A billion-prompt plan at 5,000 items
a unit is 200k units; the driver keeps one small record a unit, never its items.
"""

from __future__ import annotations

import heapq
from typing import Dict, Iterable, List, Optional, Set, Tuple

from jobs.plan import Signature
from jobs.plan.units import UnitInfo

_Entry = Tuple[float, int, UnitInfo]  # (-cost, id, unit): the costliest first, ties by id


class UnitQueue:
    def __init__(self, units: Iterable[UnitInfo]):
        self._all: List[_Entry] = []
        self._by_signature: Dict[Signature, List[_Entry]] = {}
        self._returned: List[UnitInfo] = []
        self._left: Set[int] = set()
        for info in units:
            entry = (-info.cost, info.id, info)
            self._all.append(entry)
            self._by_signature.setdefault(info.signature, []).append(entry)
            self._left.add(info.id)
        heapq.heapify(self._all)
        for heap in self._by_signature.values():
            heapq.heapify(heap)

    def __len__(self) -> int:
        return len(self._left) + len(self._returned)

    def take(self, warm: Optional[Signature] = None) -> Optional[UnitInfo]:
        if self._returned:
            same = [i for i, u in enumerate(self._returned) if u.signature == warm]
            return self._returned.pop(same[0] if same else 0)
        heap = self._by_signature.get(warm) if warm is not None else None
        info = self._pop(heap) if heap else None
        return info if info is not None else self._pop(self._all)

    def put_back(self, info: UnitInfo) -> None:
        self._returned.append(info)

    def _pop(self, heap: List[_Entry]) -> Optional[UnitInfo]:
        while heap:
            _, unit, info = heapq.heappop(heap)
            if unit in self._left:
                self._left.discard(unit)
                return info
        return None
