"""Stop the Ray head `cluster/local.sh start` started on GCS port PORT, and no other Ray on this machine:
    python cluster/stop_head.py PORT
Its processes are the GCS server listening on PORT, every process whose command line names that head's
session folder or GCS address (raylet, dashboard, monitors, client server; worker nodes joined to it on
this machine too), and their descendants (workers, agents, dashboard modules, job drivers: their command
lines name nothing of it). `ray stop` would stop every Ray here, other users' and tests' included."""

from __future__ import annotations

import re
import sys
import time

try:
    import psutil
except ImportError:  # Ray carries its own copy (`ray stop` uses it), on the path once ray is imported
    import ray  # noqa: F401  # isort: skip

    import psutil

GRACE_S = 16  # SIGTERM, then SIGKILL for what is left, as `ray stop` does (split over its three steps)


def head_processes(port: int) -> list[psutil.Process]:
    """The processes of the Ray head whose GCS listens on ``port`` (none: no such head here)."""
    running = [(p, p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    gcs = [p for p, args in running if f"--gcs_server_port={port}" in args]
    sessions = {a.split("=", 1)[1] for p, args in running if p in gcs for a in args
                if a.startswith(("--session-dir=", "--session_dir="))}
    # the session folder, not a longer one that starts with its name (session_..._4 and session_..._45)
    named = re.compile("|".join(re.escape(s) + "(/|$)" for s in sessions)) if sessions else None
    address = re.compile(rf"^--(gcs-)?address=[^=]*:{port}$")
    roots = gcs + [p for p, args in running if any(address.match(a) or named and named.search(a) for a in args)]
    found = {}
    for p in roots:
        found[p.pid] = p
        try:
            found.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return list(found.values())


def stop(port: int) -> int:
    processes = head_processes(port)
    if not processes:
        print(f"no Ray head with its GCS on port {port} here (start and stop take it from RAY_GCS_PORT)", file=sys.stderr)
        return 0
    # in `ray stop`'s order: raylets first (their agents and workers follow them), the GCS last (stopped
    # earlier, the others wait for it and leave only when killed)
    raylets = [p for p in processes if name(p) == "raylet"]
    gcs = [p for p in processes if name(p) == "gcs_server"]
    rest = [p for p in processes if p not in raylets and p not in gcs]
    killed = []
    for step in (raylets, rest, gcs):
        signal(step, psutil.Process.terminate)
        left = wait(step, GRACE_S / 3)
        signal(left, psutil.Process.kill)
        wait(left, 2)
        killed += left
    print(f"stopped the Ray head on GCS port {port}: {len(processes)} processes"
          + (f" ({len(killed)} killed after {GRACE_S / 3:.0f} s)" if killed else ""), file=sys.stderr)
    return 0


def name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return ""


def signal(processes: list[psutil.Process], send) -> None:
    for p in processes:
        try:
            send(p)
        except psutil.NoSuchProcess:
            pass


def wait(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after ``timeout_s``; one that exited and awaits its parent's
    reaping (a zombie) has stopped."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in processes if running(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    sys.exit(stop(int(sys.argv[1])))
