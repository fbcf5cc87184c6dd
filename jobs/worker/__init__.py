"""The worker role: lease work units of a plan, generate them, commit each unit's shards.

    jobs.generate ─▶ run.py: run_job ─▶ prepare.py (check, join the plan and hold it: presence.py, leases, sink)
        ─▶ loop.py: generate_all ─▶ model.py (load, wrap with bcg) ─▶ batch_sizer.py (the pool)
        ─▶ per unit: leased_plan.py (next unit from unit_source.py, read, cut)
           ─▶ scheduler.py (encode | denoise | decode overlapped, asking dispatcher.py whether to
              capture) over pipeline.py (one batch's stages)
        ─▶ outputs.py, samples.py ─▶ unit_sink.py (shards per unit, done marker) ─▶ run.py: finish

May import: every room below it (jobs/plan/'s vocabulary and unit files, jobs/output/,
jobs/telemetry/, jobs/models/, jobs/dataset/ for the error ledger), bcg/, padding/, sinks/.
Nothing imports the worker but the front door (jobs/generate.py) and the Ray role (jobs/cluster/),
whose actors run this room's loop over units their driver hands them (unit_source.py is the seam).
Files: run, prepare, stop (pre-emption), ranks (torchrun/Slurm topology), lease (taking and
beating leases), presence (the worker's hold on its run, which job.overwrite respects), unit_source
(which unit next: leases, or a driver), leased_plan, unit_sink, loop, model, batch_sizer, scheduler,
dispatcher, pipeline, outputs, pixels, samples.
"""
