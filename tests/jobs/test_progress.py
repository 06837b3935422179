"""The progress a person reads while a run works (jobs/progress.py)."""

import re
from types import SimpleNamespace

from jobs.progress import Progress


def engine(done, tokens, in_flight=8, restarting=(), deaths=(0, 0)):
    stage = SimpleNamespace(queue=[1, 2, 3], inflight=[1, 0], running=1, restarting=set(restarting), deaths=list(deaths))
    return SimpleNamespace(roots_done=done, tokens=tokens, roots_in_flight=in_flight, stages={"generator": stage})


def test_the_progress_line_says_pairs_done_of_the_total_and_an_eta_from_the_recent_rate(monkeypatch):
    clock = iter([0.0, 30.0, 60.0, 90.0])
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: next(clock))
    lines = []
    progress = Progress(lines.append, total=1000, live=False, every_s=0.0)
    progress(engine(0, 0))
    progress(engine(100, 30_000))
    progress(engine(200, 60_000))
    # 200 pairs in 60 s: 800 left at 200 pairs/min is 4 minutes
    assert lines[-1].startswith("200/1000 pairs (20%) ETA 4m00s | 200 pairs/min, 1000 tok/s over the last 60 s")
    assert "generator[queued=3 running=1]" in lines[-1]
    progress(engine(200, 60_000))  # stalled for 30 s: the rate of the last minute halves; the ETA's rate
    # is that of the last ten minutes (here the whole run: 200 pairs in 90 s), so 800 left take 6 minutes
    assert lines[-1].startswith("200/1000 pairs (20%) ETA 6m00s | 100 pairs/min")


def test_when_pairs_finish_in_waves_the_eta_stays_put_between_them(monkeypatch):
    """Continuous batching with long trajectories: 40 pairs finish every 3 minutes, none in between.
    The rate of the last minute is 0 between waves; the ETA must not turn into "?" or swing with it."""
    now = [0.0]
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: now[0])
    lines = []
    progress = Progress(lines.append, total=1000, live=False, every_s=0.0)
    finishes = []  # when each report says the run will end: now + ETA
    for step in range(0, 61):  # 30 minutes, a report every 30 s
        now[0] = 30.0 * step
        progress(engine(40 * (step // 6), 0))
        eta = lines[-1].split(" ETA ")[1].split(" |")[0]
        assert eta != "?" or step < 6  # nothing had finished yet
        if now[0] >= 600:
            h, m, s = re.fullmatch(r"(?:(\d+)h)?(\d+)m(?:(\d+)s)?", eta).groups(default="0")
            finishes.append(now[0] + 3600 * int(h) + 60 * int(m) + int(s))
    assert " 0 pairs/min" in lines[-2]  # between waves, the last minute saw nothing
    # at the true pace (40 pairs / 3 min) the 1000 pairs end at 4,500 s; every report says so within 25%
    assert all(0.75 * 4500 <= end <= 1.25 * 4500 for end in finishes), finishes


def test_without_a_terminal_the_interval_is_10_s_unless_set(monkeypatch):
    """README: "one plain line every 10 s in logs and Ray jobs"."""
    clock = iter([0.0, 5.0, 9.5, 10.0, 15.0, 19.5])
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: next(clock))
    lines = []
    progress = Progress(lines.append, total=10, live=False)
    assert progress.every_s == 10.0  # how often the engine reports too
    for done in range(1, 7):
        progress(engine(done, 0))
    assert [line.split()[0] for line in lines] == ["1/10", "4/10"]  # at 0 s and 10 s only


def test_without_a_terminal_progress_is_one_plain_line_per_interval(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 11.0])
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: next(clock))
    lines = []
    progress = Progress(lines.append, total=10, live=False, every_s=10.0)
    assert progress.display is None and progress.every_s == 10.0
    for done in (1, 2, 3, 4):
        progress(engine(done, 0))
    assert [line.split()[0] for line in lines] == ["1/10", "4/10"]


def test_the_runs_end_is_printed_once(monkeypatch):
    """The engine reports in its loop and once more at the end: the last line was printed twice."""
    clock = iter([0.0, 1.0, 2.0])
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: next(clock))
    lines = []
    progress = Progress(lines.append, total=10, live=False, every_s=10.0)
    progress(engine(3, 0))
    for _ in range(2):
        progress(engine(10, 0, in_flight=0))
    assert [line.split()[0] for line in lines] == ["3/10", "10/10"]


def test_replicas_that_take_no_work_yet_are_shown_as_starting_or_restarting(monkeypatch):
    """A replica that Ray keeps restarting (killed for memory at every start) must be visible at a glance."""
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: 0.0)
    lines = []
    progress = Progress(lines.append, total=10, live=False, every_s=0.0)
    progress(engine(0, 0, restarting={0, 1}))
    assert "generator[queued=3 running=1 starting=2]" in lines[-1]
    progress(engine(0, 0, restarting={1}, deaths=(0, 3)))
    assert "generator[queued=3 running=1 restarting=1]" in lines[-1]


def test_on_a_terminal_the_live_line_keeps_each_stages_bracketed_counts(monkeypatch, capsys):
    """rich read `generator[queued=3 running=1 starting=2]` as a markup tag and dropped it from the live line."""
    monkeypatch.setattr("jobs.progress.time.perf_counter", lambda: 0.0)
    progress = Progress(lambda line: None, total=10, live=True)
    progress(engine(0, 0, restarting={0, 1}))
    progress.close()
    assert "generator[queued=3 running=1 starting=2]" in capsys.readouterr().err
