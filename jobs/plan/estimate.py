"""`python -m jobs.plan --estimate`: how long a plan takes, from its costs and a measured rate.

Every unit carries its cost (megapixel-steps: pixels x frames x steps, x2 with CFG; units.py
item_cost); a rate (cost a second, one worker) turns it into time. The rate is measured, never
guessed: a job that ran in this output_dir (its timeline), or the last job of this model, device
and quality tier that finished on this machine (the rate cache). Without either, the estimate
says so and gives the cost alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Set

from jobs.plan.units import PlanManifest, item_cost


class RateLike(Protocol):
    # Read-only, as jobs.telemetry.rates.Rate (a frozen dataclass) has them.
    @property
    def cost_per_s(self) -> float: ...
    @property
    def source(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def first_batch_s(self) -> Optional[float]: ...


@dataclass(frozen=True)
class Estimate:
    items: int
    items_left: int
    cost_left: float  # megapixel-steps
    seconds: Optional[float]  # one worker, the items left; None without a rate
    rate: Optional[RateLike]

    @property
    def gpu_hours(self) -> Optional[float]:
        return None if self.seconds is None else self.seconds / 3600

    def lines(self, workers: int = 1) -> List[str]:
        head = (f"estimate: {self.items_left} of {self.items} planned items left, {format_cost(self.cost_left)} "
                f"megapixel-steps")
        if self.rate is None:
            return [head, "  no measured rate for this model and quality tier here: time unknown. Run a short job "
                          "first (e.g. dataset.limit=32) into this output_dir, or any finished job of this model on "
                          "this machine, and estimate again"]
        seconds, gpu_hours = self.seconds, self.gpu_hours
        assert seconds is not None and gpu_hours is not None  # estimate() gives seconds whenever it has a rate
        wall = seconds / workers
        lines = [head,
                 f"  at {format_cost(self.rate.cost_per_s)} megapixel-steps/s a worker ({self.rate.source}):",
                 f"  {format_duration(seconds)} on one worker"
                 + (f", {format_duration(wall)} on {workers}" if workers > 1 else "")
                 + f"; {format_cost(gpu_hours)} {'GPU' if self.rate.device != 'cpu' else 'CPU-worker'}-hours"]
        if self.rate.first_batch_s and self.items_left:  # the fixed part of a worker's wait, not in the rate
            lines.append(f"  plus {self.rate.first_batch_s:.1f}s a worker before its first batch (its start-up, the "
                         f"plan and the model's load, as that job waited)")
        return lines


def format_cost(x: float) -> str:
    """Megapixel-steps for a person: 1,234,567 for a real job, 0.128 for a tiny one."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def cost_of(manifest: PlanManifest) -> Dict[str, float]:
    """Cost per item of each signature (str, as the timeline names it)."""
    return {str(u.signature): item_cost(u.signature) for u in manifest.units}


def estimate(manifest: PlanManifest, done: Set[int], rate: Optional[RateLike]) -> Estimate:
    left = [u for u in manifest.units if u.id not in done]
    cost = sum(item_cost(u.signature) * u.count for u in left)  # exact: plan.json rounds each unit's cost
    seconds = cost / rate.cost_per_s if rate is not None else None
    return Estimate(items=manifest.n_items, items_left=sum(u.count for u in left), cost_left=cost, seconds=seconds,
                    rate=rate)
