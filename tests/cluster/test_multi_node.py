"""Three Ray nodes on this machine (a head and two workers, each started with `ray start` like a real
cluster's nodes, with ports and sockets of their own): the answer job, submitted with `ray job submit`,
places its pools by custom resources, and a worker node killed mid-run (every process of it) costs no
row: its generator replica restarts on the other worker, every id is answered exactly once."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cluster.test_job_submit import free_port, kill_session
from tests.conftest import REPO, SAMPLE_CORPUS, SAMPLE_QUESTIONS

pytestmark = [pytest.mark.ray, pytest.mark.model, pytest.mark.timeout(1200)]
BIN = Path(sys.executable).parent
NAMED = "node_is_"


def node_ports() -> list[str]:
    """The ports a second raylet on one machine must not share with the first."""
    names = ("node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent",
             "metrics-export")
    return [f"--{name}-port={free_port()}" for name in names]


class LocalCluster:
    def __init__(self):
        self.temp = tempfile.mkdtemp(prefix="rm", dir="/tmp")  # Ray's socket paths must stay short
        # token auth as local.sh starts the head: the workers and the client join with the token it made
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{self.temp}/auth_token",
                    "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_DASHBOARD_PORT": str(free_port()), "RAY_GCS_PORT": str(free_port()),
                    "RAY": str(BIN / "ray"), "PATH": f"{BIN}:{os.environ['PATH']}"}
        # worker nodes need Ray's multi-node switch on, whatever the environment this test runs in says
        self.env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        self.env.pop("RAY_AUTH_TOKEN", None)
        self.dashboard = f"http://127.0.0.1:{self.env['RAY_DASHBOARD_PORT']}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, resources: dict, head: bool = False) -> None:
        # a resource of its own names the node (`ray start` has no node name option)
        common = ["--num-cpus=2", f"--resources={json.dumps({**resources, NAMED + name: 1})}",
                  "--object-store-memory=200000000", "--block"]
        if head:
            command = [str(REPO / "cluster" / "local.sh"), "start", f"--temp-dir={self.temp}",
                       f"--ray-client-server-port={free_port()}", *node_ports(), *common]
        else:
            # a temp dir of its own, as a node of a real cluster has: nodes sharing one unpack the job's
            # working_dir into the same runtime_resources folder, under the driver's feet (a prompt file
            # read by the driver went missing for 20 questions)
            command = [str(BIN / "ray"), "start", f"--address=127.0.0.1:{self.env['RAY_GCS_PORT']}",
                       f"--temp-dir={self.temp}/{name}", *node_ports(), *common]
        with open(f"{self.temp}/{name}.log", "w") as log:  # what `ray start` said, for a node that did not come up
            self.nodes[name] = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def start_three_nodes(self) -> None:
        """A head with ``retrieval`` (shards, encoders) and two workers with ``llm`` (generator replicas),
        one after the other: two raylets registering at once on a busy 2-core box can miss `ray start`'s
        30 s deadline; such a worker is started again."""
        self.start("head", {"retrieval": 4}, head=True)
        for count, (name, resources) in enumerate((("head", None), ("worker-a", {"llm": 1}), ("worker-b", {"llm": 1})), 1):
            for attempt in range(3):
                if resources and (attempt or name not in self.nodes):
                    self.start(name, resources)
                deadline = time.monotonic() + 120
                while len(self.alive_nodes()) < count and time.monotonic() < deadline:
                    if self.nodes[name].poll() is not None:  # its `ray start` gave up
                        break
                    time.sleep(2)
                if len(self.alive_nodes()) >= count:
                    break
            else:
                logs = {n: Path(f"{self.temp}/{n}.log").read_text()[-1500:] for n in self.nodes}
                raise AssertionError(f"node {name} did not come up: {self.alive_nodes()}, {logs}")

    def ray_list(self, what: str, *options: str) -> list[dict]:
        proc = subprocess.run([str(BIN / "ray"), "list", what, "--address", self.dashboard, "--format", "json",
                               "--limit", "1000", *options], env=self.env, capture_output=True, text=True, timeout=60)
        try:
            return json.loads(proc.stdout) if proc.returncode == 0 else []
        except ValueError:  # the dashboard is not up yet
            return []

    def alive_nodes(self) -> dict[str, str]:
        """node id -> node name, of the nodes alive now."""
        return self.node_names(alive_only=True)

    def node_names(self, alive_only: bool = False) -> dict[str, str]:
        """node id -> node name (a killed node keeps its id and name in Ray's node table)."""
        return {n["node_id"]: name for n in self.ray_list("nodes", "--detail")
                if (n["state"] == "ALIVE" or not alive_only)
                and (name := next((r.removeprefix(NAMED) for r in n.get("resources_total") or {}
                                   if r.startswith(NAMED)), None))}

    def kill(self, name: str) -> None:
        kill_session(self.nodes[name].pid)

    def stop(self) -> None:
        for proc in self.nodes.values():
            kill_session(proc.pid)
            proc.wait(30)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def cluster():
    c = LocalCluster()
    try:
        c.start_three_nodes()
        yield c
    finally:
        c.stop()


def ragsift(*args, env=None):
    subprocess.run([sys.executable, "-m", "jobs.cli", *map(str, args)], cwd=REPO, check=True, capture_output=True,
                   env={**(env or os.environ), "RAY_ADDRESS": ""}, timeout=600)


def test_pools_placed_by_resources_survive_a_worker_node_killed_mid_run(cluster, tmp_path):
    questions = pq.read_table(SAMPLE_QUESTIONS).slice(0, 60)
    pq.write_table(questions, tmp_path / "q.parquet")
    pq.write_table(pq.read_table(SAMPLE_CORPUS).slice(0, 300), tmp_path / "c.parquet")
    ragsift("index", "--corpus", tmp_path / "c.parquet", "--index-dir", tmp_path / "idx", "--shards", 2)
    out = tmp_path / "answers"
    submit = subprocess.Popen(
        [cluster.env["RAY"], "job", "submit", "--address", cluster.dashboard, "--working-dir", str(REPO),
         "--runtime-env", str(REPO / "cluster" / "runtime_env.yaml"), "--",
         "python", "-m", "jobs.cli", "answer", "--questions", str(tmp_path / "q.parquet"), "--index-dir",
         str(tmp_path / "idx"), "--output", str(out), "--strategy", "direct,rag", "--generator", "smollm2-135m-instruct",
         "--set", "generator.cpu_kvcache_gib=1", "--set", "commit.shard_rows=10",
         "--set", "generator.resources={llm: 1}", "--set", "embedder.resources={retrieval: 1}",
         "--set", "retrieval.shard_resources={retrieval: 1}", "--set", "engine.failure_cooldown_s=0.5",
         "--set", "cache.enabled=false"],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # find the generator replica's node while the first parts are being answered, then kill that whole node
    # the moment one is committed: `ray list` takes seconds on a busy box, and on a fast one the rest of
    # the run can end before a lookup made after the first commit returns
    deadline = time.monotonic() + 600
    placed, pools = {}, ("StreamingGenerator", "Encoder", "ShardRetriever")
    while not all(placed.get(p) for p in pools) or not list(out.glob("*/part-*.parquet")):
        assert submit.poll() is None, submit.stdout.read()[-4000:]
        assert time.monotonic() < deadline, f"no part committed in 10 minutes; placed {placed}"
        if not all(placed.get(p) for p in pools):  # `ray list` can fail on a busy box: ask again
            nodes = cluster.alive_nodes()
            placed = {a["class_name"]: nodes.get(a["node_id"])
                      for a in cluster.ray_list("actors") if a["state"] == "ALIVE"}
        time.sleep(0.2)
    victim = placed["StreamingGenerator"]
    parts_before = len(list(out.glob("*/part-*.parquet")))
    cluster.kill(victim)

    def survivor() -> str | None:
        """The node the generator replica ran on after the kill. Any state: on a fast box the job can end
        (and its actors with it) before a lookup sees the replica alive again; a dead actor keeps the
        node it last ran on."""
        nodes = cluster.node_names()
        return next((nodes[a["node_id"]] for a in cluster.ray_list("actors")
                     if a["class_name"] == "StreamingGenerator" and nodes.get(a["node_id"], victim) != victim), None)

    log = submit.communicate(timeout=900)[0]
    assert submit.returncode == 0 and "succeeded" in log, log[-4000:]

    assert victim in ("worker-a", "worker-b")  # the generator asked for `llm`, which only the workers have
    assert placed["Encoder"] == "head" and placed["ShardRetriever"] == "head"  # `retrieval` is the head's
    assert parts_before < 12, "the node was killed after the run ended: nothing was shown"
    rows = pa.concat_tables([pq.read_table(out / s) for s in ("direct", "rag")]).to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(questions["id"].to_pylist() * 2)  # exactly once, none lost
    assert not [r["error"] for r in rows if r["error"]]
    metrics = json.loads((out / "metrics.json").read_text())
    assert all(c["ok"] for c in metrics["exactly_once"].values()) and metrics["replica_restarts"] >= 1
    assert survivor() == {"worker-a": "worker-b", "worker-b": "worker-a"}[victim]
