"""A pool's replicas on Ray: what each one reserves, where it is placed, how often Ray restarts it. Which
pools a run needs, and with what, is the job's to say (jobs/pools.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pool:
    """One actor pool: a replica per entry of ``replicas`` (its constructor arguments); each replica asks
    Ray for ``num_cpus``, ``num_gpus`` and the custom ``resources`` that place it (config: ``resources``)."""

    actor: type
    num_cpus: float
    num_gpus: float
    replicas: tuple[tuple, ...]
    resources: dict[str, float] = field(default_factory=dict)
    placement_group: dict | None = None  # {bundles, strategy}: a placement group per replica (multi-device LLMs)

    @property
    def per_replica(self) -> dict[str, float]:
        """Every resource one replica reserves (CPU, GPU, custom): its placement group's bundles, if any."""
        if not self.placement_group:
            return {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        total: dict[str, float] = {}
        for bundle in self.placement_group["bundles"]:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return total

    @property
    def cpus(self) -> float:
        return self.per_replica.get("CPU", 0.0) * len(self.replicas)


def start_replicas(pool: Pool, max_restarts: int) -> tuple[list, list]:
    """The replicas of ``pool``, and the placement groups made for them (one a replica over several devices).
    Ray restarts a dead replica up to ``max_restarts`` times; the engine, not Ray, retries its batches
    (max_task_retries 0), to isolate a bad request."""
    import ray  # here, not at import: the jobs that plan pools without starting them load no Ray

    remote, replicas, groups = ray.remote(pool.actor), [], []
    for args in pool.replicas:
        options = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus, "resources": pool.resources or None,
                   "max_restarts": max_restarts, "max_task_retries": 0,
                   **(in_placement_group(pool) if pool.placement_group else {})}
        if "scheduling_strategy" in options:
            groups.append(options["scheduling_strategy"].placement_group)
        # one options() call: Ray's options() returns a wrapper that has no options() of its own
        replicas.append(remote.options(**options).remote(*args))
    return replicas, groups


def in_placement_group(pool: Pool) -> dict:
    """Actor options that start one replica in a placement group of its own, which reserves every device
    of its vLLM workers: the actor runs in the first bundle (reserving nothing more itself), and vLLM's
    ray executor, which finds the group it runs in, starts a worker in each device bundle. A restarted
    replica comes back in the same group, on the devices kept for it."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.placement_group(pool.placement_group["bundles"], strategy=pool.placement_group["strategy"])
    return {"num_cpus": 0, "num_gpus": 0, "resources": None,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0,
                                                                    placement_group_capture_child_tasks=True)}
