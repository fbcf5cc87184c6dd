"""The Ray role: a driver that hands work units to bcgen workers running as Ray actors.

    jobs.generate +cluster=ray ─▶ driver.py: check the config, connect (connect.py), join or make
        the plan (as any worker's rank 0 does), start the actors (actor.py) ─▶ pool.py: hand each
        actor a unit at a time (queue.py: warm signature first, then the costliest; the driver holds
        each unit's lease), hand a dead actor's units to the others, replace the actor
        ─▶ progress.py: one bar for all actors ─▶ summary.py: index + summary.json, merged

An actor is a long-lived worker: it loads the model once and runs the ordinary generation loop
(jobs/worker/loop.py) over a UnitFeed (feed.py), the UnitSource whose units the driver pushes. It
commits each unit as every worker does (per-unit shard names, manifests, the done marker last),
so a unit redone after its actor died continues after the shards that actor committed.

May import: the worker room (jobs/worker/) and everything it may import. Nothing imports this room
but the front door (jobs/generate.py), and only with +cluster=ray. `import ray` happens only here
(Ray is the optional extra `.[ray]`; connect.py turns its absence into a UserError).
Files: connect, driver, pool, queue, grants (the driver's lease per unit), feed, actor, progress, summary.
"""
