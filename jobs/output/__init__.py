"""The output room: everything about an output_dir as a place, none of it about generating.

May import: jobs.errors, jobs.kill_hook, sinks/; never the worker, the planner or telemetry (they
all import this room). Files: layout (every name in output_dir), storage (local folder or object
store), mirror (an object store kept in step with its staging folder), claim (run.json, locks,
the wipe), leases (the lease file format), done (done markers), schema (the parquet sidecar's
columns), audit (what `python -m jobs.verify` checks), compare (what `jobs.verify --against` compares),
key_table (the SQLite file on disk it sorts two runs' keys in).
"""
