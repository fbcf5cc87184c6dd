"""Reach the Ray cluster named by `ray.address`, or say what to do instead (one UserError).

    auto        the running cluster: RAY_ADDRESS (which `ray job submit` sets) or `ray start` on this node
    local       a new cluster on this machine, for this job only (it ends with the driver)
    host:port   a cluster's GCS address

Ray is imported only here and in the modules of this room that the driver imports after
`require_ray()`; without the extra the job stops with the install command, not an ImportError.
"""

from __future__ import annotations

import logging

from jobs.config import RayConfig
from jobs.errors import UserError

log = logging.getLogger("jobs.cluster")

TESTED = "2.60"  # the Ray minor the tests run (pyproject's `ray` extra)


def require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("+cluster=ray needs Ray, which is not installed: pip install -e '.[ray]' "
                        f"(tested with ray {TESTED}; the driver's Ray must match the cluster's)") from None


def connect(config: RayConfig) -> str:
    """ray.init for the driver; returns the cluster's address (its GCS)."""
    import ray

    if ray.is_initialized():  # a caller (a notebook, a script) connected this process already
        return ray.get_runtime_context().gcs_address
    address = None if config.address == "local" else config.address
    try:
        if address is None:
            ray.init(address="local", include_dashboard=False, log_to_driver=True)
        else:
            ray.init(address=address, log_to_driver=True)
    except ConnectionError as e:
        raise UserError(f"ray.address={config.address!r}: no Ray cluster answered ({_first_line(e)}). Start one "
                        f"(`ray start --head`), submit with `ray job submit -- python -m jobs.generate ...` "
                        f"(it sets RAY_ADDRESS), or use ray.address=local for a cluster on this machine") from None
    except ValueError as e:  # a malformed address
        raise UserError(f"ray.address={config.address!r} is invalid ({_first_line(e)}): use auto, local, "
                        f"or host:port of the cluster's head (its GCS port, 6379 by default)") from None
    resources, address = ray.cluster_resources(), ray.get_runtime_context().gcs_address
    log.info("Ray %s cluster at %s: %g CPU, %g GPU on %d node(s)", ray.__version__, address,
             resources.get("CPU", 0), resources.get("GPU", 0), len([n for n in ray.nodes() if n.get("Alive")]))
    return address


def worker_count(config: RayConfig, resources: dict, nodes: list) -> int:
    """ray.workers, or one actor per gpus_per_worker GPUs the cluster has (ray.workers=0). Refuses
    an actor no node can hold (Ray would keep it pending for ever)."""
    fits = [n for n in nodes if n.get("Alive") and n["Resources"].get("GPU", 0) >= config.gpus_per_worker
            and n["Resources"].get("CPU", 0) >= config.cpus_per_worker]
    if not fits:
        biggest = max(((n["Resources"].get("GPU", 0), n["Resources"].get("CPU", 0)) for n in nodes if n.get("Alive")),
                      default=(0, 0))
        raise UserError(f"no node of the Ray cluster has the ray.gpus_per_worker={config.gpus_per_worker:g} GPU and "
                        f"ray.cpus_per_worker={config.cpus_per_worker:g} CPU one actor needs (the largest node has "
                        f"{biggest[0]:g} GPU, {biggest[1]:g} CPU): lower them, or add such nodes")
    if config.workers:
        return config.workers
    gpus = resources.get("GPU", 0.0)
    n = int(gpus // config.gpus_per_worker)
    if n < 1:
        raise UserError(f"ray.workers=0 counts the cluster's GPUs, and it has {gpus:g} (ray.gpus_per_worker="
                        f"{config.gpus_per_worker:g}): add GPU nodes, or set ray.workers=N with "
                        f"ray.gpus_per_worker=0 for a CPU-only run")
    return n


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
