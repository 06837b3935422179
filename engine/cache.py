"""The request cache: responses the engine already has, so an identical request is never computed twice.

In memory it is the run's deduplication (an LRU of ``engine.cache_size`` requests and ``engine.cache_mb``
MiB, whichever fills first). With a ``path`` it
is also an SQLite database that outlives the run: a rerun, a resumed run, a sweep's values and a
Session's calls find what any earlier run computed. A request's key is its own fields (its ``step``
name aside) under the *namespace* of the pool that answers it: everything else that decides the
response (model and its revision, sampling, index manifest...), given by the job that built the pools
(jobs/request_cache.py). Error responses are never stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import sqlite3
import time
from collections import OrderedDict, deque
from pathlib import Path

from schemas.records import (
    Entailment,
    Generation,
    Judgment,
    Passage,
    Ranking,
    Request,
    Response,
    Retrieval,
)

RESPONSES = {cls.__name__: cls for cls in (Generation, Judgment, Retrieval, Ranking, Entailment)}
WRITE_EVERY = 256  # responses buffered before one transaction (a commit per response would cost more than the lookup saves)
# ...or this many seconds, whichever comes first: a slow model (a 1.5B trajectory takes minutes on a CPU)
# fills 256 in hours, and a driver killed without cleanup (kill -9, a lost node) loses what is buffered
WRITE_AFTER_S = 10.0
# a write another writer's lock refused waited SQLite's busy timeout (60 s): the next waits twice as long as the last
# pause, from WRITE_AFTER_S up to this, instead of one per put (each would hold the driver for the busy timeout)
LOCKED_RETRY_MAX_S = 640.0
# responses waiting, at most: past it they are written at once, or, while the file is locked, the oldest go unsaved
# (counted)
PENDING_MAX_BYTES = 64 * 2**20


class RequestCache:
    def __init__(self, size: int, path: str | Path | None = None, namespaces: dict[str, str] | None = None,
                 max_bytes: int | None = None, memory_bytes: int | None = None):
        self.size = size
        self.memory_bytes = memory_bytes  # engine.cache_mb: the memory part's bound, besides ``size`` entries
        self.held = 0  # bytes the memory part holds, as ``footprint`` reckons them
        self.max_bytes = max_bytes  # the disk part's bound (cache.max_mb): pruned to at open and after each write
        self.memory: OrderedDict[Request, tuple[Response, int]] = OrderedDict()  # each with its footprint
        self.path = Path(path).expanduser() if path else None
        self.namespaces = namespaces or {}
        self.pending: deque[tuple[str, str, str, float]] = deque()
        self.pending_bytes = 0
        self.flushed_at = time.monotonic()
        self.retry_s = 0.0  # the pause before the next write while the file is locked; 0 = not locked
        self.unsaved = 0  # responses dropped unwritten while the file stayed locked
        self.carried = 0  # the oldest of ``pending``, which an earlier run left waiting (see ``run_mark``)
        self._db: sqlite3.Connection | None = None
        self.disk_error: str | None = None  # why the disk part was given up for this run
        self.read_only = False  # the file is read where it lies (a folder this run cannot write): nothing is stored
        self.pruned = 0  # responses deleted, the oldest first, to keep it under its bound
        self.undecodable = 0  # stored rows that could not be read back: looked up as misses
        self._marked = False  # a run has taken its run_mark

    COUNTS = ("pruned", "undecodable", "unsaved")

    def run_mark(self) -> dict[str, int]:
        """The counts a run starts from, for ``counts_since``: runs may share the cache (a Session's calls, a
        sweep's values), and each run's metrics count its own. Zero at the first run, whose open this was (what
        the open pruned is that run's)."""
        mark = dict.fromkeys(self.COUNTS, 0) if not self._marked else {c: getattr(self, c) for c in self.COUNTS}
        self._marked = True
        self.carried = len(self.pending)  # the last run counted these unsaved already
        return mark

    def counts_since(self, mark: dict[str, int] | None = None) -> dict[str, int]:
        """Responses pruned, stored rows undecodable and responses unsaved since ``mark`` (``run_mark``; None: since
        the cache was opened); unsaved counts those dropped while the file stayed locked and those still waiting
        for it, but not those an earlier run left waiting (counted in its metrics)."""
        mark = mark or dict.fromkeys(self.COUNTS, 0)
        counts = {c: getattr(self, c) - mark[c] for c in self.COUNTS}
        counts["unsaved"] += len(self.pending) - self.carried
        return counts

    def get(self, request: Request) -> tuple[Response | None, str | None]:
        """The stored response and where it was found ("memory" or "disk"), or (None, None)."""
        if request in self.memory:
            self.memory.move_to_end(request)
            return self.memory[request][0], "memory"
        if not self._on_disk(request):
            return None, None
        try:
            row = self.db.execute("SELECT response FROM responses WHERE key = ?", (self.key(request),)).fetchone()
        except (sqlite3.DatabaseError, OSError) as err:  # OSError: its folder cannot be made
            if not locked(err):  # locked past the busy timeout by another writer: a miss, this once
                self._give_up_disk(err)
            return None, None
        if row is None:
            return None, None
        try:
            response = decode(row[0])
        except (ValueError, TypeError, KeyError, AttributeError):
            # written by another version of ragsift (fields this one lacks) or damaged: computed again,
            # and the new response replaces the row
            self.undecodable += 1
            return None, None
        self._remember(request, response)
        return response, "disk"

    def put(self, request: Request, response: Response) -> None:
        if getattr(response, "error", None):
            return
        self._remember(request, response)
        if self._on_disk(request):
            text = encode(response)
            self.pending.append((self.key(request), request.stage, text, time.time()))
            self.pending_bytes += len(text)
            while self.retry_s and self.pending_bytes > PENDING_MAX_BYTES:  # the file is locked: the oldest go
                self.pending_bytes -= len(self.pending.popleft()[2])
                if self.carried:  # an earlier run's, counted unsaved in its metrics
                    self.carried -= 1
                else:
                    self.unsaved += 1
            if not self.retry_s and (len(self.pending) >= WRITE_EVERY or self.pending_bytes > PENDING_MAX_BYTES):
                self.flush()
            else:
                self.flush_if_due()

    def flush_if_due(self) -> None:
        """Write what is buffered once WRITE_AFTER_S (or, while the file is locked, ``retry_s``) have passed since
        the last write."""
        if self.pending and time.monotonic() - self.flushed_at >= max(WRITE_AFTER_S, self.retry_s):
            self.flush()

    def flush(self) -> None:
        """Write the buffered responses (the engine calls this when a run ends and, through
        ``flush_if_due``, every WRITE_AFTER_S seconds; ``put`` every WRITE_EVERY responses; both only every
        ``retry_s`` while another writer holds the file locked)."""
        self.flushed_at = time.monotonic()
        if self.pending and self.disk_error is None and not self.read_only:
            try:
                with self.db:  # one transaction
                    self.db.executemany("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", self.pending)
            except (sqlite3.DatabaseError, OSError) as err:  # OSError: its folder cannot be made
                if locked(err):  # by another writer past the busy timeout: kept for a later write
                    self.flushed_at = time.monotonic()
                    self.retry_s = min(LOCKED_RETRY_MAX_S, 2 * self.retry_s or WRITE_AFTER_S)
                    return
                self._give_up_disk(err)
            self.retry_s = 0.0
            # at every write, not only at open: a long run's writes would otherwise grow the file past its bound
            if self.max_bytes is not None:
                self.prune(self.max_bytes)
        self.pending.clear()
        self.pending_bytes = 0
        self.carried = 0

    def prune(self, max_bytes: int, keep: float = 0.8) -> int:
        """Where the stored responses take more than ``max_bytes``, delete the oldest written until they take
        about ``keep`` x ``max_bytes``; returns how many. SQLite reuses the freed pages, so the file stops
        growing, though it does not shrink. Without it the file grew by every response any run computed."""
        if self.path is None or self.disk_error is not None or not self.path.exists():
            return 0
        try:
            db = self.db
            if self.read_only:  # known once it is open: a run may prune before its first lookup
                return 0
            pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                                    "page_size"))
            used = (pages - free) * size
            if used <= max_bytes:
                return 0
            rows = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
            drop = min(rows, math.ceil(rows * (1 - keep * max_bytes / used)))
            with db:
                db.execute("DELETE FROM responses WHERE key IN (SELECT key FROM responses ORDER BY created, rowid LIMIT ?)",
                           (drop,))
        except (sqlite3.DatabaseError, OSError) as err:
            if not locked(err):  # another writer holds it past the busy timeout: pruned by a later run
                self._give_up_disk(err)
            return 0
        self.pruned += drop
        return drop

    def _on_disk(self, request: Request) -> bool:
        return self.path is not None and self.disk_error is None and request.stage in self.namespaces

    def _give_up_disk(self, err: Exception) -> None:
        """A damaged or unreadable cache file costs the run its disk cache (reported in metrics.json's
        request_cache.disk_error), not its answers."""
        damaged = (isinstance(err, sqlite3.DatabaseError) and re.search(r"not a database|malformed|corrupt", str(err))
                   and not self.read_only)  # a shared file this run cannot write is not its to delete
        # a full or read-only disk leaves the file whole: deleting it would lose every response it holds
        advice = ("delete the file, or run with --no-cache" if damaged else
                  "the file is kept; give cache.path a place this run can write, with space, or run with --no-cache")
        self.disk_error = f"{self.path}: {type(err).__name__}: {err} ({advice})"
        self.pending.clear()
        self.pending_bytes = 0
        self.carried = 0

    def key(self, request: Request) -> str:
        fields = [getattr(request, f.name) for f in dataclasses.fields(request) if f.compare]
        kind = type(request).__name__
        # a namespace per stage, or per stage and request kind where that kind's responses depend on less
        namespace = self.namespaces.get(f"{request.stage}/{kind}", self.namespaces[request.stage])
        text = json.dumps([namespace, kind, fields], ensure_ascii=False)
        # surrogatepass: a lone surrogate (a reply's broken emoji) has a key too; valid text encodes as before
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def __len__(self) -> int:
        return len(self.memory)

    def _remember(self, request: Request, response: Response) -> None:
        if not self.size:
            return
        if request in self.memory:
            self.held -= self.memory.pop(request)[1]
        # counted in bytes too: a retrieval of many passages is large, so a bound in entries alone leaves the
        # memory of each driver and engine actor unbounded
        held = footprint(request) + footprint(response)
        self.memory[request] = (response, held)
        self.held += held
        while len(self.memory) > self.size or (self.memory_bytes is not None and self.held > self.memory_bytes):
            self.held -= self.memory.popitem(last=False)[1][1]

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            if self.path.exists() and not os.access(self.path.parent, os.W_OK):
                self.read_only = True
                self._db = _read_only(self.path)
                return self._db
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # WAL: concurrent runs on one machine read while another writes; busy_timeout waits out a writer
            self._db = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS responses "
                             "(key TEXT PRIMARY KEY, stage TEXT, response TEXT, created REAL)")
        return self._db


def footprint(value) -> int:
    """The bytes ``value`` holds in memory, roughly: its texts and a few dozen bytes per object (within ~10% of
    tracemalloc's count for a retrieval of 50 passages; over it for short requests)."""
    if isinstance(value, str):
        return 50 + len(value)
    if isinstance(value, (tuple, list)):
        return 56 + 8 * len(value) + sum(map(footprint, value))
    if isinstance(value, dict):
        return 64 + sum(footprint(k) + footprint(v) for k, v in value.items())
    if hasattr(value, "__dict__"):
        return 150 + footprint(tuple(vars(value).values()))
    return 24


def locked(err: sqlite3.DatabaseError) -> bool:
    """A lock another writer holds (engine actors share the file): it passes; corruption does not."""
    return isinstance(err, sqlite3.OperationalError) and "locked" in str(err)


def encode(response: Response) -> str:
    value = [type(response).__name__, dataclasses.asdict(response)]
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate SQLite cannot bind (the run died at its write): escaped, it reads back
        return json.dumps(value)
    return text


def decode(text: str) -> Response:
    name, values = json.loads(text)
    if name == "Retrieval":
        values["passages"] = [Passage(**p) for p in values["passages"]]
    return RESPONSES[name](**values)


def _read_only(path: Path) -> sqlite3.Connection:
    """A cache file in a folder this run cannot write (a home an admin prepared, on a read-only mount), opened
    for reading: read-only where SQLite can (it then reads a WAL a killed writer left), else as immutable,
    which needs no lock files but reads only what was checkpointed into the file itself."""
    uri = path.resolve().as_uri()
    try:
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60, check_same_thread=False)
        db.execute("SELECT 1 FROM responses LIMIT 1").fetchall()
        return db
    except sqlite3.OperationalError:  # a WAL file's lock files cannot be made here
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=60, check_same_thread=False)
