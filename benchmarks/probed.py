"""Run a Python program with the probes its environment asks for, from its first line to its exit:

    python benchmarks/probed.py -m jobs.generate [overrides...]     # as `python -m jobs.generate ...`
    python benchmarks/probed.py -c CODE [args...]                    # as `python -c CODE ...`

    BENCH_GC_FILE=PATH                 every garbage collection (gc_pauses.py)
    BENCH_TRACE=START_S:SECONDS:PATH   the GPU's kernels and clocks over a window (gpu_trace.py)

bench_job_wall.py's --gc and --trace run the job (and --trace the plain loop) through this.
"""

from __future__ import annotations

import runpy
import sys

import gc_pauses
import gpu_trace


def main(argv: list) -> None:
    if len(argv) < 2 or argv[0] not in ("-m", "-c"):
        raise SystemExit("usage: probed.py -m MODULE [args...] | -c CODE [args...]")
    gc_pauses.install_from_env()
    trace = gpu_trace.install_from_env()
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    finally:
        if trace is not None:
            # A program that ends inside the window still gets its trace, written while the interpreter
            # still runs (the thread imports torch and the profiler's exporters, which a shutting-down
            # interpreter refuses). jobs.generate leaves through os._exit: gpu_trace's atexit join.
            trace.join()


if __name__ == "__main__":
    main(sys.argv[1:])
