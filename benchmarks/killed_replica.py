"""How long vLLM's engine core outlives an async replica that the engine kills (a timeout, a hung call).

An async replica (AsyncLLM) runs vLLM's engine core in a process of its own, and vLLM 0.32's engine core
does not watch its parent. The engine kills a replica with ``ray.kill(..., no_restart=False)`` (SIGKILL,
no shutdown call), so the core goes only when Ray reaps the dead worker's children; one that lingered
would hold its memory (on a GPU: the device's) while the restarted replica loads its model beside it.
This starts one async replica of SmolLM2, kills it as the engine does, and times the old engine core's
processes (vLLM titles them ``VLLM::...``) until they are gone; ``--busy`` adds busy loops beside it.

    python benchmarks/killed_replica.py --out results/benchmarks/killed_replica.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_end_to_end import vllm_processes  # noqa: E402  the end-to-end tests' detector of vLLM's processes


def one_kill(model: str, busy: int) -> dict:
    import ray

    from engine.replicas import start_replicas
    from jobs.pools import pool_plan
    from strategies.registry import AnswerConfig

    config = AnswerConfig.model_validate({"generator": {"model": model, "serving": "async"}})
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        before = vllm_processes()
        [replica], _ = start_replicas(pool_plan(config, {"generator"})["generator"], 1)
        started = time.perf_counter()
        ray.get(replica.__ray_ready__.remote())
        ready_s = time.perf_counter() - started
        core = vllm_processes() - before
        assert core, "no vLLM process seen for the replica"
        killed = time.perf_counter()
        ray.kill(replica, no_restart=False)  # as the engine kills a replica (engine/loop.py)
        while core & vllm_processes() and time.perf_counter() - killed < 300:
            time.sleep(0.02)
        gone_s = time.perf_counter() - killed
        left = core & vllm_processes()
        ray.kill(replica, no_restart=True)
        return {"busy_processes": busy, "replica_ready_s": round(ready_s, 1), "engine_processes": len(core),
                "gone_after_kill_s": round(gone_s, 2), "still_alive_after_300_s": len(left)}
    finally:
        for hog in hogs:
            hog.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--busy", type=int, nargs="+", default=[0],
                        help="busy-loop processes beside the replica, one run each (with every core busy a 2-core box "
                             "took 313 s to start the replica)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from jobs.ray_session import init_ray
    from schemas.config import RayConfig

    init_ray(RayConfig(num_cpus=2))
    results = []
    for busy in args.busy:
        results.append(one_kill(args.model, busy))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
