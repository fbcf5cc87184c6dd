"""The worker role: lease work units of a plan, generate them, commit each unit's shards.

    jobs.generate (run.py) ─▶ LeasedPlan (leased_plan.py: lease, read unit, batches)
        ─▶ generate_loop + engine ─▶ UnitSink (unit_sink.py: shards per unit, done marker)

`lease.py` holds the claim files, `done.py` the done markers. The planner role is `jobs/plan/`.
"""
