"""End `python -m jobs.generate` as soon as the job has returned: skip the interpreter's teardown.

An orderly exit tears down every module and object the job loaded (torch, transformers, diffusers, the
model): 1.6 s after a SANA-1.6B-size job on the H200, from the job's last log line to the process's exit
(benchmarks/results/job_wall_h200_1024_s38trace.md), and 1.1 s after a tiny job on a 2-core CPU, nearly
all of it in native finalisation (py-spy). Nothing the job wrote needs it: shards, markers and the
summary are on disk by then (atomic renames after fsync), and the log lines are flushed below.

So `exit_after(main)` runs main, then does what an orderly exit does that matters (the atexit handlers,
the logging handlers' flush and close, stdout and stderr's flush) and leaves with os._exit and main's
exit status. It exits the orderly way where that could lose work or output:
- a non-daemon thread is still alive (an orderly exit waits for it);
- main raised anything but SystemExit (Python prints the traceback);
- BCGEN_FAST_EXIT=0, for tools that act after the module returns (`python -m cProfile -m jobs.generate`
  writes its profile then).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import Callable, NoReturn, Optional, Union

ENV = "BCGEN_FAST_EXIT"

Code = Union[int, str, None]


def exit_after(main: Callable[[], None]) -> NoReturn:
    """Run main; exit with its status, skipping the interpreter's teardown where that is safe."""
    try:
        main()
        code: Code = 0
    except SystemExit as e:
        code = e.code
    if not _safe():
        raise SystemExit(code)
    status = _status(code)
    atexit._run_exitfuncs()  # what Py_Finalize would run first: coverage, profilers' writers, libraries' hooks
    logging.shutdown()  # flush and close every handler (Hydra's job log file)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: an orderly exit would not have written either
            pass
    os._exit(status)


def _safe() -> bool:
    if os.environ.get(ENV, "1") == "0":
        return False
    main = threading.main_thread()
    return not any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate())


def _status(code: Optional[Union[int, str]]) -> int:
    """SystemExit's rule: None is 0, an int is itself, anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
