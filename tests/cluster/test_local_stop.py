"""`cluster/local.sh stop` stops the head it names and no other Ray on the machine. Run inside a private PID
namespace (unshare), so that a stop that reaches too far ends only this test's Rays, never another user's."""

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_pid_namespace() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def head(name: str, temp: str, dashboard: bool) -> str:
    """A `local.sh start` of a head with every port of its own (as local.sh's header says a second head needs)."""
    ports = " ".join(f"--{option}-port={free_port()}" for option in (
        "dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent", "metrics-export", "ray-client-server"))
    return (f"{name}_GCS={free_port()}\n"
            f"RAY_DASHBOARD_PORT={free_port()} RAY_GCS_PORT=${name}_GCS {REPO}/cluster/local.sh start --num-cpus=1 "
            f"--temp-dir={temp} --include-dashboard={str(dashboard).lower()} {ports} > {temp}.log 2>&1 || exit 3\n")


def pids(path: Path) -> set[int]:
    """The processes a snapshot lists, less the `ps` that took it."""
    return {int(line.split(None, 1)[0]) for line in path.read_text().splitlines()
            if line.split(None, 1)[1:] and not line.split(None, 1)[1].startswith("ps ")}


@pytest.mark.skipif(not private_pid_namespace(), reason="needs unshare --pid (root or user namespaces)")
def test_local_sh_stop_stops_the_head_on_its_gcs_port_and_leaves_another_ray_on_the_machine_running(tmp_path):
    """`stop` was a plain `ray stop`: it stopped every Ray on the machine, the second head its header explains too."""
    bin_dir = Path(sys.executable).parent
    temps = [tempfile.mkdtemp(prefix=f"rs{n}", dir="/tmp") for n in "AB"]  # Ray's socket paths must stay short
    snap = f"ps -eo pid=,args= > {tmp_path}"
    script = (f"export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY={bin_dir}/ray PATH={bin_dir}:$PATH\n"
              f"{snap}/before\n" + head("A", temps[0], dashboard=True) + f"{snap}/a\n"
              + head("B", temps[1], dashboard=False) + f"{snap}/ab\n"
              f"RAY_GCS_PORT=$A_GCS {REPO}/cluster/local.sh stop > {tmp_path}/stop_a.log 2>&1 || exit 4\n"
              f"sleep 1; {snap}/b\n"
              f"RAY_GCS_PORT=$B_GCS {REPO}/cluster/local.sh stop > {tmp_path}/stop_b.log 2>&1 || exit 5\n"
              f"sleep 1; {snap}/none\n")
    (tmp_path / "two_heads.sh").write_text(script)
    try:
        # every process left in the namespace ends with it (its PID 1, the script, exits)
        proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "bash", str(tmp_path / "two_heads.sh")],
                              capture_output=True, text=True, timeout=540)
        logs = {p.name: p.read_text()[-1500:] for p in [*tmp_path.glob("*.log"), *(Path(f"{t}.log") for t in temps)]
                if p.exists()}
    finally:
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
            Path(f"{temp}.log").unlink(missing_ok=True)
    assert proc.returncode == 0, (proc.stderr[-2000:], logs)
    base = pids(tmp_path / "before")
    a = pids(tmp_path / "a") - base
    b = pids(tmp_path / "ab") - pids(tmp_path / "a")
    assert len(a) >= 6 and len(b) >= 4, logs  # GCS, raylet, monitors, agents (A: the dashboard and its modules too)
    after_a = pids(tmp_path / "b")
    assert after_a & a == set(), ("A's processes left", logs)
    assert b <= after_a, ("B's processes stopped with A's", logs)
    assert "stopped the Ray head on GCS port" in logs["stop_a.log"], logs
    assert pids(tmp_path / "none") <= base, logs
