"""`ray job submit` against a local head node started as cluster/local.sh does (token auth on), with the real model."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, SAMPLE_QUESTIONS

pytestmark = [pytest.mark.ray, pytest.mark.model, pytest.mark.timeout(900)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head(tmp_path):
    """A head started like cluster/local.sh (``--block``, in its own process group), stopped by killing
    that group: ``ray stop`` would stop every Ray on the machine, including other tests' sessions."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "auth_token"), "RAY_ADDRESS": "",
           "RAY_DASHBOARD_PORT": str(free_port()), "RAY_GCS_PORT": str(free_port()), "RAY": str(bin_dir / "ray"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("RAY_AUTH_TOKEN", None)  # local.sh makes the token file, and the clients read it
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # Ray's socket paths must stay short
    # every port of its own: the default agent ports clash with any other Ray on this machine (a
    # clash leaves the head without a job agent: "No available agent to submit job")
    ports = [f"--{name}-port={free_port()}" for name in ("dashboard-agent-listen", "dashboard-agent-grpc",
                                                          "runtime-env-agent", "metrics-export", "ray-client-server")]
    command = [str(REPO / "cluster" / "local.sh"), "start", "--num-cpus=2", f"--temp-dir={temp}", *ports, "--block"]
    proc = subprocess.Popen(command,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield env, f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}"
    finally:
        kill_session(proc.pid)
        proc.wait(30)
        shutil.rmtree(temp, ignore_errors=True)


def kill_session(sid: int) -> None:
    """Kill every process of the head's session: `ray start --block` ignores SIGTERM to its group and its
    workers move to process groups of their own, but all of them stay in the session."""
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                p.kill()
        except (ProcessLookupError, psutil.Error):
            pass


def test_answer_job_submitted_to_a_local_head_writes_its_output(head, tmp_path):
    env, address = head
    out = tmp_path / "answers"
    command = [env["RAY"], "job", "submit", "--address", address, "--working-dir", str(REPO),
         "--runtime-env", str(REPO / "cluster" / "runtime_env.yaml"), "--",
         "python", "-m", "jobs.cli", "answer", "--questions", "data/demo/sample_questions.parquet",
         "--output", str(out), "--strategy", "direct", "--limit", "3", "--generator", "smollm2-135m-instruct",
         "--set", "generator.cpu_kvcache_gib=1"]
    for _ in range(40):  # the head's job API comes up some seconds after `ray start`
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=800)
        log = proc.stdout + proc.stderr
        if not any(m in log for m in ("No available agent to submit job", "Failed to connect to Ray", "Connection refused")):
            break
        time.sleep(3)
    assert proc.returncode == 0 and "succeeded" in log, log[-4000:]
    rows = pq.read_table(out / "direct").to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(pq.read_table(SAMPLE_QUESTIONS)["id"].to_pylist()[:3])
    assert all(r["error"] is None and r["answer"].strip() for r in rows)

    # the head's token, made by local.sh, is its owner's alone, and a client without it is refused
    assert (Path(env["RAY_AUTH_TOKEN_PATH"]).stat().st_mode & 0o777) == 0o600
    stranger = {**env, "RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path / "elsewhere")}
    stranger.pop("RAY_AUTH_TOKEN_PATH")
    proc = subprocess.run([env["RAY"], "job", "list", "--address", address], env=stranger, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "authentication" in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
