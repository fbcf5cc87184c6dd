"""A real local Ray cluster for tests, on the loopback, shared by a test module.

Started by the test process with `ray.init(address="local")`, so its processes (GCS, raylet,
actors) are this process's to stop: `ray.shutdown()` ends exactly them (never `ray stop`, which
ends every Ray process on the machine). Jobs under test connect to it as drivers of their own
(`ray.address=<the GCS address>`), as `ray job submit` would; the test process stays connected
too, so it can find and `ray.kill` their actors.

Ray binds a node to the machine's routable address by default; here every node is this machine,
so RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray use the loopback (its single-machine mode). Actor
processes inherit the environment this process has when the cluster starts (the S3 server's
credentials and endpoint, a staging root): set it first.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 4) -> Iterator[str]:
    """Yields the cluster's GCS address (host:port) for `ray.address=`."""
    import ray
    from ray._private import ray_constants

    saved, saved_flag = os.environ.get(LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"  # read at import by every process the cluster and the tests start
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already (pytest.importorskip)
    ray.init(address="local", num_cpus=num_cpus, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = saved


def bcgen_actors() -> list:
    """Handles of the live actors of bcgen jobs on the connected cluster (named bcgen-<job>-partNNNN)."""
    import ray
    from ray.util import list_named_actors

    out = []
    for entry in list_named_actors(all_namespaces=True):
        if entry["name"].startswith("bcgen-"):
            try:
                out.append((entry["name"], ray.get_actor(entry["name"], namespace=entry["namespace"])))
            except ValueError:  # died between the listing and the lookup
                continue
    return out
