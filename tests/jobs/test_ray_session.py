import os
import subprocess
import sys
import time

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
        if not ray.is_initialized():  # connected, Ray answers with its node's address instead
            assert get_node_ip_address() == "127.0.0.1"
    finally:
        ray_session._bind_to_loopback(False)
    assert (ray_constants.ENABLE_RAY_CLUSTER, os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")) == before
    if switched_by_the_session:
        ray_session._bind_to_loopback()
