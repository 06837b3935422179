"""One driver per output: the second is refused with one line naming the first; a dead owner's lease is
taken over. Before, a second driver deleted the first one's unfinished part and both did all the work."""

import json
import os
import socket
import subprocess
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.lease import LEASE, Lease, OutputInUse


def eventually(condition, within_s: float = 20.0) -> bool:
    """Whether ``condition`` holds within ``within_s``: a heartbeat thread runs when the box lets it, so a test
    waits for what it looks for instead of sleeping a fixed while."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def heartbeat(folder) -> float:
    return json.loads((folder / LEASE).read_text())["heartbeat"]


def test_a_second_driver_is_refused_naming_the_owner_until_the_first_releases(tmp_path):
    first = Lease(str(tmp_path), heartbeat_s=0.05)
    first.acquire()
    with pytest.raises(OutputInUse, match=rf"in use by pid {os.getpid()} on {socket.gethostname()}") as err:
        Lease(str(tmp_path)).acquire()
    assert "\n" not in str(err.value)
    before = heartbeat(tmp_path)
    assert eventually(lambda: heartbeat(tmp_path) > before)  # the heartbeat is renewed
    first.release()
    assert not (tmp_path / LEASE).exists()
    with Lease(str(tmp_path)):
        assert (tmp_path / LEASE).exists()
    assert not (tmp_path / LEASE).exists()


def test_a_lease_whose_owner_is_gone_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for held in ({"host": socket.gethostname(), "pid": dead.pid, "started": 0, "heartbeat": time.time()},
                 {"host": "elsewhere", "pid": 1, "started": 0, "heartbeat": time.time() - 3600}):
        (tmp_path / LEASE).write_text(json.dumps(held))
        log = []
        with Lease(str(tmp_path), heartbeat_s=0.05, log=log.append):
            assert json.loads((tmp_path / LEASE).read_text())["pid"] == os.getpid()
        assert "taking over" in log[0] and str(held["pid"]) in log[0]


def test_a_lease_file_without_a_readable_record_yet_is_not_taken_over(tmp_path):
    """Before, a lease read while being written counted as stale (no heartbeat) and was taken over."""
    (tmp_path / LEASE).write_text("")
    with pytest.raises(OutputInUse):
        Lease(str(tmp_path)).acquire()
    os.utime(tmp_path / LEASE, (time.time() - 3600, time.time() - 3600))
    with Lease(str(tmp_path), log=lambda *_: None):  # an old unreadable lease is stale
        assert json.loads((tmp_path / LEASE).read_text())["pid"] == os.getpid()


def test_a_driver_whose_lease_was_taken_over_stops_writing_its_heartbeat(tmp_path):
    log = []
    first = Lease(str(tmp_path), heartbeat_s=0.05, log=log.append)
    first.acquire()
    successor = {"host": "elsewhere", "pid": 7, "started": 1.0, "heartbeat": time.time()}
    (tmp_path / LEASE).write_text(json.dumps(successor))
    assert eventually(lambda: any("lost the lease" in line and "pid 7" in line for line in log))
    assert json.loads((tmp_path / LEASE).read_text()) == successor
    first.release()
    assert json.loads((tmp_path / LEASE).read_text()) == successor  # release leaves the new owner's lease


class FlakyReads:
    """A filesystem whose reads fail for a while, as a storage service's do under load."""

    def __init__(self, fs):
        self.fs, self.failing = fs, True

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open_input_stream(self, path):
        if self.failing:
            raise OSError("AWS Error SLOW_DOWN")
        return self.fs.open_input_stream(path)


def test_a_storage_error_while_renewing_is_retried_and_the_lease_is_kept(tmp_path):
    log = []
    lease = Lease(str(tmp_path), heartbeat_s=0.05, log=log.append)
    lease.acquire()
    lease.fs = store = FlakyReads(lease.fs)
    assert eventually(lambda: any("heartbeat failed" in line for line in log))
    store.failing = False
    before = heartbeat(tmp_path)
    assert eventually(lambda: heartbeat(tmp_path) > before)  # renewed again
    assert not any("lost the lease" in line for line in log)
    lease.release()
    assert not (tmp_path / LEASE).exists()


def test_where_hard_links_are_not_allowed_the_lease_is_still_exclusive(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("jobs.lease.os.link", no_links)
    with Lease(str(tmp_path)):
        assert json.loads((tmp_path / LEASE).read_text())["pid"] == os.getpid()
        with pytest.raises(OutputInUse):
            Lease(str(tmp_path)).acquire()
    assert not list(tmp_path.iterdir())  # no temporary file left


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_a_second_answer_on_a_running_output_exits_2_and_the_first_finishes_exactly_once(tmp_path, capsys):
    from jobs.cli import run_job
    from tests.jobs.test_resume import finish, start

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(40)], "question": [f"question {i}" for i in range(40)]}),
                   questions)
    proc = start(questions, out)
    deadline = time.time() + 120
    while not (out / "_manifest.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the first driver finished before the second could start"
    code = run_job("answer", ["--questions", str(questions), "--output", str(out), "--strategy", "direct"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "is in use by pid" in err
    finish(proc)
    metrics = json.loads((out / "metrics.json").read_text())
    # each strategy of the run holds each of the 40 questions once (an empty check passed `all` before)
    assert {s: (c["rows"], c["expected"], c["ok"]) for s, c in metrics["exactly_once"].items()} == {
        "direct": (40, 40, True), "rag": (40, 40, True)}
    assert not (out / LEASE).exists()


def test_a_driver_that_lost_its_lease_commits_nothing_more(tmp_path):
    """A driver paused past stale_s and taken over went on renaming parts the new owner was writing."""
    from jobs.lease import LeaseLost
    from jobs.output import ShardedOutput
    from schemas.tables import ANSWERS

    lease = Lease(str(tmp_path), heartbeat_s=60)
    lease.acquire()
    out = ShardedOutput(str(tmp_path), {"generator.model": "m"}, ["rag"], shard_rows=2, guard=lease.check)
    out.sealed(0, 1)
    (tmp_path / LEASE).write_text(json.dumps({"host": "elsewhere", "pid": 7, "started": 1, "heartbeat": time.time()}))
    with pytest.raises(LeaseLost, match=r"pid 7 on elsewhere\) took over"):
        out.write({**{n: None for n in ANSWERS.names}, "id": "q0", "strategy": "rag", "answer": "a", "_shard": 0})
    assert not (tmp_path / "rag" / "part-00000.parquet").exists()
    lease.release()
    assert json.loads((tmp_path / LEASE).read_text())["host"] == "elsewhere"  # the new owner's lease is left alone


def test_a_live_lease_stamped_by_a_clock_a_minute_behind_is_not_taken_over(tmp_path):
    """The stamp is the owner's clock: a second host 70 s ahead took over a lease renewed every 10 s."""
    import threading

    stop = threading.Event()

    def owner_elsewhere():  # renews every 20 ms, stamping an hour behind this host's clock
        while not stop.wait(0.02):
            (tmp_path / LEASE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": 0,
                                                      "heartbeat": time.time() - 3600}))
    owner_elsewhere_thread = threading.Thread(target=owner_elsewhere, daemon=True)
    (tmp_path / LEASE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": 0, "heartbeat": time.time() - 3600}))
    owner_elsewhere_thread.start()
    try:
        with pytest.raises(OutputInUse):
            Lease(str(tmp_path), heartbeat_s=0.1).acquire()
    finally:
        stop.set()
        owner_elsewhere_thread.join()


def test_a_lease_of_this_pids_earlier_life_is_taken_over(tmp_path):
    """A restarted container is often pid 1 again: its own dead driver's lease refused it for 60 s."""
    (tmp_path / LEASE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": 1.0,
                                              "heartbeat": time.time()}))
    with Lease(str(tmp_path), heartbeat_s=0.05, log=lambda *_: None):
        assert json.loads((tmp_path / LEASE).read_text())["started"] != 1.0


def test_of_two_drivers_finding_the_same_dead_owner_one_takes_the_output_and_the_other_is_refused(tmp_path):
    """Both read the dead owner's lease; the second to take over wrote over the first's (the same .tmp
    name too: a FileNotFoundError, or a record of two interleaved writes), and both stopped."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = {"host": socket.gethostname(), "pid": dead.pid, "started": 0, "heartbeat": time.time()}
    (tmp_path / LEASE).write_text(json.dumps(stale))
    late = Lease(str(tmp_path), heartbeat_s=0.05, log=lambda *_: None)
    reads = iter([stale])  # what `late` read before the other driver took over
    real_read = late._read
    late._read = lambda: next(reads, None) or real_read()
    first = Lease(str(tmp_path), heartbeat_s=0.05, log=lambda *_: None)
    first.acquire()
    try:
        with pytest.raises(OutputInUse, match="in use by pid"):
            late.acquire()
        first.check()  # still the owner
    finally:
        first.release()


def test_a_takeover_lock_is_one_drivers_at_a_time_and_a_killed_ones_blocks_nothing(tmp_path):
    import fcntl

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / LEASE).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": 0,
                                              "heartbeat": time.time()}))
    guard = tmp_path / f"{LEASE}.takeover"
    with open(guard, "a") as other:  # another driver taking the output over right now
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(OutputInUse):
            Lease(str(tmp_path), log=lambda *_: None).acquire()
    # its file left behind (a driver killed while it took over) holds no lock: the next driver goes on
    with Lease(str(tmp_path), heartbeat_s=0.05, log=lambda *_: None):
        assert json.loads((tmp_path / LEASE).read_text())["pid"] == os.getpid()
