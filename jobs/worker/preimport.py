"""The model's Python modules, imported in a background thread while the worker plans.

diffusers and transformers take seconds to import (`import diffusers` pulls in `torch._dynamo`;
the pipeline class pulls in its text encoder's transformers modules): 4-8 s on the H200 machine,
measured with py-spy (benchmarks/results/job_wall_h200_spy_s26.md), as long as everything else
before the first batch together. None of it depends on the plan, so it starts when the worker does
and runs beside the config checks and the planning, whose slow part on a fresh machine (hashing
the weights, jobs/plan/weights_digest.py) runs in hashlib without the GIL.

    pre = Preimport.start(family)      # the worker's first step
    ...                                # check, plan, claim output_dir
    pre.wait()                         # just before the model loads; re-raises nothing

A failed import here is not an error: the load imports the same modules again and raises its own
error there, with the job's handling of it (a missing class is a UserError at load). Python's
per-module import locks make two threads importing one module safe: the second waits for the
first. The thread is a daemon: a job refused while it runs exits without waiting for it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Optional

from jobs.models.base import ModelFamily

log = logging.getLogger(__name__)


class Preimport:
    def __init__(self, family: ModelFamily) -> None:
        self.family = family
        self.seconds: Optional[float] = None
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="bcgen-preimport", daemon=True)

    @classmethod
    def start(cls, family: ModelFamily) -> "Preimport":
        pre = cls(family)
        pre._thread.start()
        return pre

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            diffusers = importlib.import_module("diffusers")
            if self.family.pipeline_class:
                getattr(diffusers, self.family.pipeline_class)  # diffusers' lazy module imports the pipeline's
        except BaseException as e:  # noqa: BLE001 - the load imports again and reports it (module docstring)
            self.error = e
        self.seconds = time.perf_counter() - t0

    def wait(self) -> None:
        """Until the imports are done (the load would wait on their module locks anyway)."""
        t0 = time.perf_counter()
        self._thread.join()
        waited = time.perf_counter() - t0
        if self.error is not None:
            log.debug("preimport of %s failed (%s: %s); the load imports it again", self.family.pipeline_class,
                      type(self.error).__name__, self.error)
        else:
            log.debug("preimport: diffusers and %s in %.1fs beside the plan (%.1fs of it waited for here)",
                      self.family.pipeline_class, self.seconds or 0.0, waited)
