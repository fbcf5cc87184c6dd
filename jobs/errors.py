"""The one user-error type: bad config, bad data or a bad environment.

Raised wherever such a problem is found, with a message that names the key or `file:line`, the
value and the fix; caught once, at each front door (jobs/generate.py, jobs/plan/__main__.py, ...),
which logs the message and exits 2 without a traceback. Anything else raised during a job is a
crash and keeps its traceback (exit 1):
a ValueError from inside diffusers is a bug to report, not a typo to fix.

It subclasses ValueError so that library callers who catch ValueError for bad input keep
working; the top level catches only UserError, never a bare ValueError.
"""

from __future__ import annotations

import errno

# The front doors' exit codes (jobs.generate, jobs.plan, jobs.inspect, jobs.verify).
EXIT_USAGE = 2  # a UserError: one message, no traceback
EXIT_INTERRUPTED = 130  # Ctrl-C: complete samples committed; rerun to resume
EXIT_PREEMPTED = 143  # 128 + SIGTERM: not complete; rerun (or requeue) to resume
EXIT_TEMPFAIL = 75  # sysexits' EX_TEMPFAIL: the environment failed (disk full, read-only, a lost lease); rerun later


class UserError(ValueError):
    """Bad config, data or environment; the message says where, what, and how to fix it."""


class EnvironmentFailure(UserError):
    """The environment failed under a running job (disk full, a read-only folder, a lease taken over):
    nothing committed is damaged, and the same command resumes once it is fixed. Exit 75."""

    exit_code = EXIT_TEMPFAIL


# OS errors that are the environment's by their nature: the disk, the quota, the mount.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                       errno.EROFS: "the filesystem is read-only", errno.EACCES: "permission denied",
                       errno.EPERM: "permission denied", errno.EIO: "an I/O error (a failing disk or mount?)"}


def environment_failure(err: BaseException) -> str | None:
    """The one message for a disk full, read-only or unwritable folder met while a job runs (an
    OSError, or the sink's SinkError caused by one); None when `err` is not such a failure."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    if cause is None or cause.errno not in _ENVIRONMENT_ERRNOS:
        return None
    where = f" writing {cause.filename}" if cause.filename else ""
    what = str(err) if not isinstance(err, OSError) else f"{_ENVIRONMENT_ERRNOS[cause.errno]}{where} ({cause.strerror})"
    return (f"{what}. Committed shards are intact and nothing was deleted. Free space or fix the folder's "
            f"permissions or mount, then rerun the same command: it resumes where this run stopped")
