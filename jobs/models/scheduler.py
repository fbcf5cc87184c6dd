"""`model.scheduler`: denoise with another of diffusers' schedulers, built from the checkpoint's config.

    model.scheduler=DPMSolverMultistepScheduler

diffusers' own way (`pipe.scheduler = Cls.from_config(pipe.scheduler.config)`):
the checkpoint's settings (shift, sigmas, prediction type) carry over, the new class keeps what
it knows. Checked by name before any weight loads; the class must be one of the pipeline's
compatibles where the checkpoint's scheduler lists them (a flow-matching model with a DDPM
scheduler would draw noise, not images).
"""

from __future__ import annotations

import difflib
from typing import List, Optional

from jobs.errors import UserError


def scheduler_names() -> List[str]:
    import diffusers

    return sorted(n for n in dir(diffusers) if n.endswith("Scheduler") and not n.startswith("_")
                  and isinstance(getattr(diffusers, n, None), type) and issubclass(getattr(diffusers, n),
                                                                                   diffusers.SchedulerMixin))


def check_scheduler(name: Optional[str]) -> None:
    """A scheduler class diffusers has; UserError naming the nearest ones otherwise."""
    if name is None:
        return
    names = scheduler_names()
    if name not in names:
        near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        raise UserError(f"model.scheduler={name!r} is not a diffusers scheduler"
                        + (f"; did you mean {' or '.join(near)}?" if near else "")
                        + f" Known: {', '.join(names)}")


def apply_scheduler(pipe, name: Optional[str]) -> None:
    if name is None:
        return
    import diffusers

    current = pipe.scheduler
    cls = getattr(diffusers, name)
    compatible = {c.__name__ for c in getattr(current, "compatibles", [])} | {type(current).__name__}
    if len(compatible) > 1 and name not in compatible:
        raise UserError(f"model.scheduler={name}: the checkpoint's {type(current).__name__} lists "
                        f"{', '.join(sorted(compatible))} as compatible, not {name}; pick one of those")
    pipe.scheduler = cls.from_config(current.config)
