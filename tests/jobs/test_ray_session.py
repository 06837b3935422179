import os
import subprocess
import sys
import time

import pytest
import ray

from tests.conftest import REPO
from tests.listeners import non_loopback_listeners

# Starts ragsift's local Ray with the dashboard on, places an actor (a worker process with its own gRPC
# server), then stays up until its stdin closes, while Ray's agents and metrics endpoints come up.
LOCAL_RAY = """
import os, sys, ray
from jobs.ray_session import init_ray
from schemas.config import RayConfig
init_ray(RayConfig(num_cpus=1, include_dashboard=True))
@ray.remote
class Probe:
    def ping(self):
        return "pong"
probe = Probe.remote()
assert ray.get(probe.ping.remote()) == "pong"
print("ready", os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), flush=True)
sys.stdin.read()
"""


def test_the_listener_check_sees_a_child_listening_on_every_interface_and_not_one_on_loopback():
    """The checks that a run listens on loopback only pass on an empty set: one that saw nothing would too."""
    listen = "import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); print(1, flush=True); input()"
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])",
                               sys.executable, "-c", listen, "0.0.0.0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    local = subprocess.Popen([sys.executable, "-c", listen, "127.0.0.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout.readline().strip() == b"1" and local.stdout.readline().strip() == b"1"
        assert [ip for ip, _, _ in non_loopback_listeners(parent.pid)] == ["0.0.0.0"]  # the child's, found
        assert non_loopback_listeners(local.pid) == set()
    finally:
        for proc in (parent, local):
            proc.stdin.close()
            proc.wait(timeout=30)


def test_a_local_ray_started_by_ragsift_listens_only_on_loopback_and_leaves_the_environment_as_it_was():
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    proc = subprocess.Popen([sys.executable, "-c", LOCAL_RAY], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        # the Ray it started binds loopback, and a process the driver starts later sees the user's switch
        assert proc.stdout.readline().strip() == "ready None"
        seen, deadline = set(), time.monotonic() + 20
        while time.monotonic() < deadline:  # listeners open over the first seconds: watch, not one look
            seen |= non_loopback_listeners(proc.pid)
            time.sleep(1)
        assert seen == set()
    finally:
        proc.stdin.close()  # the driver exits and shuts its Ray down
        proc.wait(timeout=120)


def test_joining_a_cluster_after_a_local_run_in_the_same_process_uses_the_routable_address_again():
    import ray._private.ray_constants as ray_constants
    from ray._private.services import get_node_ip_address

    from jobs import ray_session

    switched_by_the_session = bool(ray_session._switched)  # the session's local Ray may have turned it off
    if switched_by_the_session:
        ray_session._bind_to_loopback(False)
    before = (ray_constants.ENABLE_RAY_CLUSTER, os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"))
    ray_session._bind_to_loopback()
    try:
        assert ray_constants.ENABLE_RAY_CLUSTER is False and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
        if not ray.is_initialized():  # connected (the suite's session Ray), Ray answers with its node's address instead
            assert get_node_ip_address() == "127.0.0.1"
    finally:
        ray_session._bind_to_loopback(False)
    assert (ray_constants.ENABLE_RAY_CLUSTER, os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")) == before
    if switched_by_the_session:
        ray_session._bind_to_loopback()


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's calls as init_ray makes them, answered by a Ray with ``cluster`` resources (Ray here has no GPU)."""
    from jobs import ray_session

    calls, cluster = [], {"CPU": 8.0}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(("init", kwargs)))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown", {})))
    monkeypatch.setattr(ray, "cluster_resources", lambda: dict(cluster))
    monkeypatch.setattr(ray_session, "_bind_to_loopback", lambda on=True: None)
    return calls, cluster


def test_a_local_ray_on_a_machine_with_fewer_gpus_than_the_pools_request_is_refused_before_any_actor_waits(
        fake_ray, monkeypatch):
    """Before, the generator replica asking for a GPU waited for ever (`generator[queued=2 running=0 starting=1]`)."""
    from jobs.pools import pool_plan, ray_request
    from jobs.ray_session import init_ray
    from schemas.config import RayConfig
    from schemas.errors import UserError
    from strategies.registry import AnswerConfig

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the model is a name only: not looked up
    calls, cluster = fake_ray
    config = AnswerConfig.model_validate({"generator": {"model": "g", "num_gpus": 1}})
    with pytest.raises(UserError, match="request 1 GPUs and this machine has 0: with the CPU install, set the pools' "
                                        "num_gpus to 0"):
        init_ray(config.ray, *ray_request(config, pool_plan(config, {"generator"})))  # as the jobs call it
    assert [name for name, _ in calls] == ["init", "shutdown"]  # the Ray it started is not left behind
    calls.clear()
    cluster["GPU"] = 2.0
    init_ray(RayConfig(num_cpus=2), 1.0, {}, (0.75, 0.75))  # fractions of the GPUs there are fit
    assert [name for name, _ in calls] == ["init"]


def test_gpu_fractions_that_no_two_devices_hold_are_refused_though_their_sum_fits(fake_ray, monkeypatch, capsys):
    """Three replicas of 0.6 GPU on two GPUs: 1.8 <= 2 passed, and the third replica waited for ever (Ray places
    each fraction on one device)."""
    from jobs.pools import pool_plan, ray_request
    from jobs.ray_session import init_ray
    from schemas.config import RayConfig
    from schemas.errors import UserError
    from strategies.registry import AnswerConfig

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls, cluster = fake_ray
    cluster["GPU"] = 2.0
    config = AnswerConfig.model_validate({"generator": {"model": "g", "num_gpus": 0.6, "replicas": 3}})
    with pytest.raises(UserError, match=r"request 1.8 GPUs in fractions \(3 x 0.6\) that need 3 devices .* and this "
                                        "machine has 2"):
        init_ray(config.ray, *ray_request(config, pool_plan(config, {"generator"})))
    assert [name for name, _ in calls] == ["init", "shutdown"]
    calls.clear()
    # 0.7 + 0.3 fill a device, but two 0.3s that arrive first share one, and a 0.7 then waits: warned of
    init_ray(RayConfig(num_cpus=2), 1.0, {}, (0.7, 0.7, 0.3, 0.3))
    assert [name for name, _ in calls] == ["init"]
    assert "(2 x 0.7, 2 x 0.3) fit this machine's 2 GPUs only in some orders" in capsys.readouterr().err
    cluster["GPU"] = 3.0
    init_ray(RayConfig(num_cpus=2), 1.0, {}, (0.7, 0.7, 0.3, 0.3))
    assert "GPU" not in capsys.readouterr().err


def test_joining_a_cluster_without_the_gpus_the_pools_request_says_so_as_for_custom_resources(fake_ray, capsys):
    from jobs.ray_session import init_ray
    from schemas.config import RayConfig

    calls, cluster = fake_ray
    init_ray(RayConfig(address="10.0.0.1:6379"), 1.0, {"llm": 1.0}, (1.0, 1.0))
    lines = capsys.readouterr().err.splitlines()
    assert any("request 2 GPUs and the cluster has 0 now; those replicas wait for GPU nodes" in line for line in lines), lines
    assert any("custom resources {'llm': 1.0}" in line for line in lines), lines
    assert [name for name, _ in calls] == ["init"]  # an autoscaler may add GPU nodes: the job is not refused
    cluster["GPU"] = 2.0
    init_ray(RayConfig(address="10.0.0.1:6379"), 1.0, {}, (1.0, 1.0))
    assert "GPU" not in capsys.readouterr().err
    init_ray(RayConfig(address="10.0.0.1:6379"), 1.0, {}, (0.6, 0.6, 0.6))  # 1.8 in fractions: three devices
    assert "request 1.8 GPUs in fractions (3 x 0.6) that need 3 devices" in capsys.readouterr().err
