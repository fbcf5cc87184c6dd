"""bcg/prewarm.py: Triton's cache key computed ahead on a thread is the one Triton computes itself.

Each check runs in a fresh interpreter: the key is cached once a process (functools.lru_cache), so a
test process that launched a Triton kernel already would have nothing left to compute.
"""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_thread_computes_the_key_triton_then_reuses():
    out = _run("""
        from bcg.prewarm import _triton_key_function, start_triton_key
        fn = _triton_key_function()
        assert fn is not None and fn.cache_info().currsize == 0
        thread = start_triton_key()
        assert thread is not None and thread.daemon
        thread.join()
        info = fn.cache_info()
        assert (info.misses, info.currsize) == (1, 1), info
        ahead = fn()
        assert fn.cache_info().hits == 1  # Triton's own call now finds it
        fn.cache_clear()
        assert fn() == ahead  # the same value Triton computes on its own
        assert start_triton_key() is None  # known: nothing left to compute
        print("ok")
    """)
    assert out == "ok"
