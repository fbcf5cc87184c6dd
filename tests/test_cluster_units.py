"""The Ray driver's pieces that need no cluster: the order units are handed out in, the actor's
UnitFeed (give, take, release, close), the config a Ray job refuses."""

from __future__ import annotations

import threading

import pytest

from jobs.cluster.feed import UnitFeed
from jobs.cluster.queue import UnitQueue
from jobs.errors import UserError
from jobs.plan import Signature
from jobs.plan.units import UnitInfo
from tests.helpers import compose_cfg

A = Signature(height=64, width=64, frames=1, text_bucket=64, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")
B = Signature(height=128, width=128, frames=1, text_bucket=64, steps=2, guidance_scale=4.5, cfg=True, dtype="float32")


def units():
    # costs: A 5, 3, 1; B 4, 2
    return [UnitInfo(0, A, 10, 5.0), UnitInfo(1, A, 10, 3.0), UnitInfo(2, A, 10, 1.0), UnitInfo(3, B, 10, 4.0),
            UnitInfo(4, B, 10, 2.0)]


def test_queue_hands_out_the_warm_signature_first_then_the_costliest():
    q = UnitQueue(units())
    assert q.take(None).id == 0  # the costliest
    assert q.take(A).id == 1  # warm A, though B's 4.0 costs more
    assert q.take(B).id == 3
    assert q.take(None).id == 4  # costliest left (2.0 > 1.0)
    assert q.take(B).id == 2  # no B left: the costliest of any
    assert q.take(A) is None and len(q) == 0


def test_a_returned_unit_goes_first_preferring_the_warm_signature():
    q = UnitQueue(units())
    taken = [q.take(None), q.take(None), q.take(None)]  # 0 (A), 3 (B), 1 (A)
    assert [u.id for u in taken] == [0, 3, 1]
    q.put_back(taken[0])
    q.put_back(taken[1])
    assert len(q) == 4
    assert q.take(B).id == 3  # a dead actor's unit first, of the asker's signature when there is one
    assert q.take(B).id == 0
    assert [q.take(None).id, q.take(None).id, q.take(None)] == [4, 2, None]


def test_feed_gives_units_in_order_and_a_release_ends_the_drivers_wait():
    feed = UnitFeed()
    u = units()
    assert feed.give(u[0]) and feed.give(u[1])
    returned = []
    waiter = threading.Thread(target=lambda: (feed.wait(0), returned.append(0)))
    waiter.start()
    assert feed.next_unit(None).id == 0 and feed.asked.is_set() and feed.still_held(0)
    assert returned == []
    feed.release(0)
    waiter.join(timeout=10)
    assert returned == [0] and not feed.still_held(0)
    assert feed.next_unit(A).id == 1


def test_feed_close_drops_units_not_started_and_ends_the_loop():
    feed = UnitFeed()
    u = units()
    feed.give(u[0])
    feed.give(u[1])
    assert feed.next_unit(None).id == 0
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (feed.wait(1), done.set()))
    waiter.start()
    feed.close()  # unit 1 was never started: its call returns now
    waiter.join(timeout=10)
    assert done.is_set()
    assert feed.next_unit(None) is None and feed.next_unit(None) is None
    assert not feed.give(u[2])  # closed: the driver's call returns unfinished at once
    feed.release_all()
    assert not feed.still_held(0)


def test_ray_job_refuses_what_it_cannot_honour():
    pytest.importorskip("ray")
    from jobs.cluster.driver import for_actors, may_grow

    ray_cfg = ["+cluster=ray", "ray.workers=2", "ray.gpus_per_worker=0", "output_dir=/tmp/x"]
    with pytest.raises(UserError, match="job.partition=1/2"):
        for_actors(compose_cfg([*ray_cfg, "job.partition=1/2"]))
    with pytest.raises(UserError, match="ray.gpus_per_worker=0"):
        for_actors(compose_cfg([*ray_cfg, "device=cuda"]))
    cpu = for_actors(compose_cfg(ray_cfg))
    assert cpu.device == "cpu" and not may_grow(cpu)
    gpu = for_actors(compose_cfg(["+cluster=ray", "bcg.batch_grow=auto", "output_dir=/tmp/x"]))
    assert gpu.device == "cuda" and may_grow(gpu)  # planned for the actors' GPUs, wherever the driver runs
    assert not may_grow(for_actors(compose_cfg(["+cluster=ray", "output_dir=/tmp/x"])))  # bcg.batch_grow=off
    with pytest.raises(UserError, match="ray.workers=N"):
        compose_cfg(["+cluster=ray", "ray.gpus_per_worker=0", "output_dir=/tmp/x"])


def test_ray_keys_need_the_cluster_preset_and_stay_out_of_output_dir():
    from jobs.cli_check import check_command_line

    with pytest.raises(UserError, match=r"\+cluster=ray"):
        check_command_line(["ray.address=local"])
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from jobs.config import register_configs
    from tests.helpers import CONF_DIR

    register_configs()
    dirs = []
    for overrides in (["sampling.steps=3"], ["sampling.steps=3", "+cluster=ray", "ray.workers=2",
                                               "ray.gpus_per_worker=0", "ray.address=local"]):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("generate", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            dirs.append(cfg.output_dir)
    assert dirs[0] == dirs[1] == "outputs/sana_tiny--sampling.steps:3"  # a Ray run resumes a plain one's folder
