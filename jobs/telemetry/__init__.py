"""The telemetry room: what a job tells people and machines while it runs and when it ends.

May import: jobs.errors, jobs/output/ (for names and atomic writes), sinks/; never the worker or
the planner. Files: summary (JobStats, the closing block), parts (one summary over all parts),
progress (the job's shared counts and its one bar), timeline (a line per batch), tensorboard,
gpu_monitor (NVML busy), startup (the wait before the plan, from the process's start).
"""
