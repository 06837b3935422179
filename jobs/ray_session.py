"""Starting or joining Ray with settings that suit both a laptop and a cluster."""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import contextmanager

from engine.gpu_packing import described, gpus_needed, orders
from schemas.config import RayConfig
from schemas.errors import UserError

# Quiet, offline-friendly defaults; a user's own environment wins.
DEFAULT_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NO_USAGE_STATS": "1",
}


def init_ray(config: RayConfig, cpus_requested: float = 0.0, resources: dict[str, float] | None = None,
             gpus: Sequence[float] = ()):
    """Join ``config.address`` (or RAY_ADDRESS), else start a local Ray with at least the logical CPUs and
    the custom ``resources`` the run's actor pools request: they are scheduling tokens, and a pool Ray
    cannot place would wait forever. GPUs are hardware: a cluster short of them is told of (its
    autoscaler may add some). ``gpus`` holds each reservation's GPUs (a replica's, a bundle's), which Ray
    places device by device: a local Ray on a machine with fewer devices than they need is refused, one
    where they fit only in some arrival orders is warned of."""
    import ray

    for key, value in DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return ray
    with _sigterm_handler_kept():
        _init(ray, config, cpus_requested, resources, tuple(gpus))
    return ray


@contextmanager
def _sigterm_handler_kept():
    """ray.init replaces the process's SIGTERM handler with its own (``sys.exit``; its core worker's dumps a
    stack and the process ends as aborted): a handler the process had set before (the CLI's, which ends a
    job as Ctrl-C does) is set again after it. One with none keeps Ray's."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    except SystemExit as exit_:
        # a SIGTERM while ray.init ran (a scheduler's stop in a run's first seconds) met Ray's handler, whose
        # sys.exit(15) ended the job silently with status 15: the process's own handler says it instead
        if main and callable(before) and exit_.code == signal.SIGTERM:
            signal.signal(signal.SIGTERM, before)
            before(signal.SIGTERM, None)
        raise
    finally:
        # not where the handler ran meanwhile: it ignores a second SIGTERM during the clean-up (SIG_IGN)
        if main and callable(before) and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, before)


def _init(ray, config: RayConfig, cpus_requested: float, resources: dict[str, float] | None, gpus: tuple[float, ...]):
    address = config.address or os.environ.get("RAY_ADDRESS")
    env = {k: os.environ[k] for k in [*DEFAULT_ENV, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                       "RAGSIFT_HOME", "VLLM_CPU_KVCACHE_SPACE"] if k in os.environ}
    # Inside a submitted job (`ray job submit`) the job's runtime_env already applies to every actor,
    # and Ray refuses a driver runtime_env that sets the same keys: pass none there.
    runtime_env = None if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ else {"env_vars": env}
    if address:
        _bind_to_loopback(False)  # undo an earlier local run's switch in this process
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=config.log_to_driver)
        cluster = ray.cluster_resources()
        have = cluster.get("CPU", 0)
        if have < cpus_requested:
            print(f"ragsift: the actor pools request {cpus_requested:g} CPUs and the cluster has {have:g} now; "
                  "they wait for the autoscaler (lower the pools' num_cpus to run on what is there)", file=sys.stderr)
        if cluster.get("GPU", 0) < (needed := gpus_needed(gpus)):
            print(f"ragsift: the actor pools request {_gpus_asked(gpus, needed)} and the cluster has {cluster.get('GPU', 0):g} "
                  "now; those replicas wait for GPU nodes (with the CPU install, the pools' num_gpus 0 runs them on CPUs)",
                  file=sys.stderr)
        short = {name: amount for name, amount in (resources or {}).items() if cluster.get(name, 0) < amount}
        if short:
            print(f"ragsift: the actor pools ask for custom resources {short} and the cluster's nodes have "
                  f"{ {name: cluster.get(name, 0) for name in short} } now; those replicas wait for nodes that have "
                  "them (`ray start --resources`)", file=sys.stderr)
    else:
        _bind_to_loopback()
        try:
            ray.init(
                num_cpus=max(config.num_cpus or os.cpu_count(), math.ceil(cpus_requested)),
                object_store_memory=config.object_store_mb * 2**20,
                resources={name: math.ceil(amount) for name, amount in (resources or {}).items()} or None,
                include_dashboard=config.include_dashboard,
                dashboard_host=config.dashboard_host,
                log_to_driver=config.log_to_driver,
                runtime_env=runtime_env,
            )
        finally:
            # Ray's own processes have started with the switch off (workers are forked by the raylet, with
            # its environment); anything else this process starts later (a `ray start` of a worker node)
            # must see the user's environment, not ours
            _restore_environment()
        have = ray.cluster_resources().get("GPU", 0)  # what Ray found here (CUDA_VISIBLE_DEVICES included)
        if have < (needed := gpus_needed(gpus)):
            ray.shutdown()
            raise UserError(f"the actor pools request {_gpus_asked(gpus, needed)} and this machine has {have:g}: with the CPU "
                            "install, set the pools' num_gpus to 0 to run on CPUs; or join a cluster with GPUs "
                            "(ray.address or RAY_ADDRESS)")
        if gpus and orders(gpus, int(have))[1]:
            print(f"ragsift: Ray places each GPU fraction on one device as the actors arrive, and the pools' "
                  f"({described(gpus)}) fit this machine's {have:g} GPUs only in some orders: in others a replica "
                  "waits for ever. Fractions that fill a device in any order (0.5, 0.25) or whole GPUs do not",
                  file=sys.stderr)


def _gpus_asked(gpus: tuple[float, ...], needed: int) -> str:
    """'2 GPUs', or where fractions cannot share devices so as to fit in their sum, the ``needed`` devices too."""
    total = sum(gpus)
    if needed > math.ceil(total - 1e-9):
        return (f"{total:g} GPUs in fractions ({described(gpus)}) that need {needed} devices (Ray places each "
                "fraction on one device, beside only what fits there)")
    return f"{total:g} GPUs"


_LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_switched: dict = {}  # what the switch was before this process turned it off


def _bind_to_loopback(on: bool = True):
    """A Ray that ragsift starts is for this machine only: with node IP 127.0.0.1 its GCS, raylet,
    workers, agents and metrics endpoints all bind to loopback (Ray binds every interface otherwise,
    unauthenticated /metrics included). ray.init turns a 127.0.0.1 ``_node_ip_address`` back into the
    routable address unless Ray's single-machine switch is off; the switch is read at import, so the
    driver's copy is set too, and the environment carries it to the processes ray.init starts (init_ray
    restores the environment after). Joining a cluster later in the same process needs the routable
    address again: ``on=False`` restores it."""
    import ray._private.ray_constants as ray_constants

    if on and not _switched:
        _switched.update(env=os.environ.get(_LOOPBACK_SWITCH), constant=ray_constants.ENABLE_RAY_CLUSTER)
        os.environ[_LOOPBACK_SWITCH] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    elif not on and _switched:
        _restore_environment()
        ray_constants.ENABLE_RAY_CLUSTER = _switched["constant"]
        _switched.clear()


def _restore_environment() -> None:
    """The switch as the environment had it before ``_bind_to_loopback`` (the driver's constant stays off)."""
    if _switched and _switched["env"] is None:
        os.environ.pop(_LOOPBACK_SWITCH, None)
    elif _switched:
        os.environ[_LOOPBACK_SWITCH] = _switched["env"]
