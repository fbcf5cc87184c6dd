"""Errors the sink raises at run time (bad user input stays a plain ValueError)."""

from __future__ import annotations


class SinkError(RuntimeError):
    """Writing a shard failed (disk full, EIO, a vanished directory, ...).

    Raised by the sink on the call after the failure. The message names the shard and file, the OS
    error, and states what the caller most needs to know: committed shards are intact (they were
    fsync'd and renamed before the failure) and the run can be resumed.
    """


class CorruptShardError(RuntimeError):
    """A file under a final shard name cannot be read as a tar.

    The sink never renames an incomplete shard to its final name, so this means outside damage
    (a truncated copy, a bad disk), not an interrupted run.
    """


class CommitRefused(RuntimeError):
    """Raised by a writer's guard (sinks/shard_writer.py `Owner.guard`): this writer may not commit
    these names any more (a job's worker whose lease was taken over). Nothing was committed; the
    sink passes the error on as it is, so its caller can stop cleanly."""
