"""One driver per output directory: an exclusive lease, ``<output>/_lease.json``.

Two drivers on one ``--output`` (a job submitted twice, a retry loop, a colleague) would both do all
the work and delete each other's unfinished parts. The lease names its owner (host, pid, start) and
carries a heartbeat that a thread renews; a second driver is refused with one line naming the owner.
A lease whose owner is gone (same host and its pid is dead, or no heartbeat for ``stale_s``) is
taken over, and a driver that finds its lease taken over stops renewing it and commits nothing more
(``check``, called before each commit: a driver paused past ``stale_s`` that wakes behind a new owner
stops with one line instead of renaming parts the new owner is writing). A lease that looks stale by
this host's clock but was written on another host is watched for one more heartbeat before it is
taken over: clocks of two hosts can be a minute apart. On a local disk the lease
is created atomically and whole (written beside, then hard-linked into place); object stores offer no
such create through pyarrow, so there the check is best effort (read, then write).
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import socket
import threading
import time
import uuid
from contextlib import suppress

import pyarrow.fs as pafs

from jobs.storage import filesystem, redact
from schemas.config import ConfigError

LEASE = "_lease.json"
PROCESS_STARTED = time.time()  # about when this process began: a lease of this pid from before is a past life


class OutputInUse(ConfigError):
    """Another live driver holds the output."""


class LeaseLost(ConfigError):
    """Another driver took the output over while this one stalled."""


class Lease:
    def __init__(self, output: str, heartbeat_s: float = 10.0, stale_s: float = 60.0, log=print, flag: str = "--output"):
        self.fs, root = filesystem(output)
        self.output, self.path = output, f"{root}/{LEASE}"
        self.heartbeat_s, self.stale_s, self.log, self.flag = heartbeat_s, stale_s, log, flag
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        if isinstance(self.fs, pafs.LocalFileSystem):  # a heartbeat's file, left by a driver killed writing it
            for left in glob.glob(f"{glob.escape(self.path)}.*.tmp"):
                with suppress(OSError):
                    if time.time() - os.stat(left).st_mtime > self.stale_s:
                        os.unlink(left)
        if not self._create():
            held = self._read()
            if held is not None and not self._stale(held):
                raise self._in_use(held)
            if not self._take_over(held):
                held = self._read() or held  # another driver took it over first: it holds the output now
                raise self._in_use(held)
            if held is not None:
                self.log(f"taking over the lease of {redact(self.output)} from pid {held.get('pid')} on "
                         f"{held.get('host')}: it is gone")
        self._thread = threading.Thread(target=self._beat, name="ragsift-lease", daemon=True)
        self._thread.start()

    def _in_use(self, held: dict) -> OutputInUse:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("started", 0)))
        return OutputInUse(
            f"{redact(self.output)} is in use by pid {held.get('pid')} on {held.get('host')} (since {since}, "
            f"last heartbeat {time.time() - held.get('heartbeat', 0):.0f} s ago); wait for it, stop it, or "
            f"use another {self.flag}")

    def _take_over(self, held: dict | None) -> bool:
        """Replace the lease found stale (``held``); False when another driver took it first. On a local
        disk one driver at a time does this, holding a lock on ``.takeover`` (the system drops it when
        its holder dies), and looks again before replacing: two drivers rerun at once after a crash both
        found it stale, both wrote, and both stopped."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            self._write()  # object stores: best effort (module docstring)
            return True
        fd = os.open(f"{self.path}.takeover", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another driver is taking it over now
                return False
            now = self._read()
            if now is not None and now != held and not self._stale(now):
                return False
            if now is not None:
                with suppress(FileNotFoundError):
                    os.unlink(self.path)
            return self._create()
        finally:
            os.close(fd)  # and with it the lock

    def check(self) -> None:
        """Raise unless this driver still holds the lease (read now: the heartbeat may not have run yet)."""
        held = self._read()
        if not self._mine(held):
            raise LeaseLost(f"another driver (pid {(held or {}).get('pid')} on {(held or {}).get('host')}) took over "
                            f"{redact(self.output)} while this one stalled: this one stops; what it committed is kept")

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        try:
            if self._mine(self._read()):
                self.fs.delete_file(self.path)
        except OSError as err:  # the run itself is done: the lease goes stale without heartbeats
            self.log(f"could not release the lease of {redact(self.output)} ({err}); it lapses in {self.stale_s:.0f} s")

    # --- internals ------------------------------------------------------------------------------

    def _record(self) -> bytes:
        return json.dumps({**self.owner, "heartbeat": time.time()}).encode()

    def _create(self) -> bool:
        """Create the lease if there is none; False when one exists."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            # written whole beside it, then linked into place: the lease appears with its record in it,
            # so a second driver never reads a half-written one
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(self._record())
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            except OSError:  # no hard links here (some FUSE / SMB mounts): an exclusive create, filled after
                return self._create_exclusive()
            finally:
                os.unlink(tmp)
        if self.fs.get_file_info(self.path).type == pafs.FileType.File:
            return False
        self._write()
        return True

    def _create_exclusive(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._record())
        return True

    def _write(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"  # this writer's own: two never share one
        with self.fs.open_output_stream(tmp) as f:
            f.write(self._record())
        self.fs.move(tmp, self.path)

    def _read(self) -> dict | None:
        """The lease's record; None when there is none. A storage error raises: it says nothing of the owner."""
        try:
            with self.fs.open_input_stream(self.path) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError:
            # not a record (yet): as fresh as the file itself, so a lease being written is not taken over
            mtime = self.fs.get_file_info(self.path).mtime  # None once the file is gone
            return {"heartbeat": mtime.timestamp() if mtime else 0}

    def _stale(self, held: dict) -> bool:
        same_host = held.get("host") == self.owner["host"]
        if time.time() - held.get("heartbeat", 0) > self.stale_s:
            if same_host:
                return True
            # the stamp is the owner's clock: watch it for a heartbeat and a half before believing it
            time.sleep(1.5 * self.heartbeat_s)
            again = self._read()
            return again is None or again.get("heartbeat") == held.get("heartbeat")
        if same_host and held.get("pid") == self.owner["pid"] and held.get("started", 0) < PROCESS_STARTED:
            return True  # this pid's earlier life, before this process began (a restarted container's pid 1): gone
        if same_host and isinstance(held.get("pid"), int):
            try:
                os.kill(held["pid"], 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # alive, someone else's
                return False
        return False

    def _mine(self, held: dict | None) -> bool:
        return bool(held) and all(held.get(k) == self.owner[k] for k in ("host", "pid", "started"))

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                held = self._read()
                if not self._mine(held):  # taken over while this driver stalled: never write over the new owner
                    self.log(f"lost the lease of {redact(self.output)} to pid {(held or {}).get('pid')} on "
                             f"{(held or {}).get('host')}; no more heartbeats from this driver")
                    return
                self._write()
            except OSError as err:  # a missed heartbeat is not fatal; a long outage makes the lease stale
                self.log(f"lease heartbeat failed: {err}")
