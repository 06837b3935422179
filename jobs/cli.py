"""The ``ragsift`` command. Each subcommand is one module under ``jobs`` with
``add_arguments(parser)`` and ``run(args) -> exit code``; each also runs as ``python -m jobs.<name>``."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import select
import signal
import sys
import threading

from jobs.storage import redact_text
from schemas.config import as_override
from schemas.errors import StageDown, UserError

DESCRIPTION = ("Adaptive retrieval-augmented question answering as a distributed batch job on Ray, vLLM and FAISS; "
               "`ragsift JOB --help` for a job's flags")

JOBS = {
    "demo": ("jobs.demo", "index the embedded sample, answer it with direct and rag, evaluate"),
    "index": ("jobs.index", "build sharded FAISS indexes from a corpus"),
    "answer": ("jobs.answer", "answer questions with one or more strategies"),
    "evaluate": ("jobs.evaluate", "score answers against gold answers and passages"),
    "compare": ("jobs.compare", "answer with several strategies and evaluate them side by side"),
    "calibrate": ("jobs.calibrate", "choose the strategies' thresholds on a calibration slice, write a config file"),
    "train": ("jobs.train", "train judge models (relevance bi- or cross-encoder, self-knowledge) from labelled questions"),
    "sweep": ("jobs.sweep", "one answer run per value of a config field (e.g. think_act.beta_threshold)"),
    "label": ("jobs.label", "training data for judge models (RA-ISF Appendix A, Self-Reasoning trajectories)"),
    "report": ("jobs.report", "turn runs into one HTML page of plots and tables"),
    "export": ("jobs.export", "a run's answers as JSON Lines: OpenAI / vLLM batch output, or the rows"),
    "models": ("jobs.models", "list or prepare the offline models"),
}

# Jobs whose output is committed as it goes and picked up by the same command run again
RESUMABLE = {"demo", "index", "answer", "compare", "calibrate", "sweep", "label"}

# Failures that are the user's input or environment (a path, a bucket, a model that is not there, a
# stage none of whose replicas can run): one line, exit 2, the traceback only with --debug. Anything
# else is a bug and keeps its traceback: a KeyError or ValueError from ragsift's own code printed as
# one line would read as the user's fault.
USER_ERRORS = (UserError, StageDown, OSError)
# what storage that stopped answering says (pyarrow's S3 and GCS clients, sockets); not a path the user gave, a
# damaged file, a full disk or a Ray timeout, which a rerun does not mend by itself
_UNREACHABLE = re.compile(r"AWS Error (NETWORK_CONNECTION|SERVICE_UNAVAILABLE|SLOW_DOWN|REQUEST_TIMEOUT)|curlCode|"
                          r"Couldn't connect|Connection (refused|reset|timed out)|Temporary failure in name resolution|"
                          r"Could not resolve host|Unable to connect", re.IGNORECASE)


def stopped_answering(err: BaseException) -> bool:
    """Whether ``err`` is storage (an object store, a network file system) that stopped answering."""
    if not isinstance(err, OSError) or type(err).__module__.startswith("ray"):
        return False
    return isinstance(err, (ConnectionRefusedError, ConnectionResetError)) or bool(_UNREACHABLE.search(str(err)))


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", help="YAML config file (repeatable: each over the one before, "
                   "field by field)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field: section.field=value, the value read as YAML (repeatable)")


def config_overrides(args: argparse.Namespace, shortcuts: dict[str, str]) -> list[str]:
    """``--set`` overrides, then the flags that are shortcuts for config fields (flag -> dotted field)."""
    return [*args.set, *(as_override(field, getattr(args, flag)) for flag, field in shortcuts.items()
                         if getattr(args, flag) is not None)]


def strategy_names(text: str | None) -> list[str] | None:
    """``--strategy``'s comma-separated names, None when it is not given. An empty name is refused:
    ``--strategy ''`` (an unset shell variable) ran the default strategies."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise UserError(f"--strategy {text!r}: an empty strategy name (comma-separated names, e.g. direct,rag)")
    return names


def _parser(name: str, module, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog=f"ragsift {name}", description=JOBS[name][1])
    module.add_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    return parser


def _stdout_closed() -> bool:
    """Whether the reader of standard output has gone (``ragsift evaluate | head -1``): a pipe with no
    reader polls as an error. A broken pipe elsewhere (a socket to a server) is not this."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (a captured stdout), or no poll here
        return False


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, `timeout`, `ray job stop`, a container's stop), taken as Ctrl-C is: the
    job stops where it is, keeps what it committed and says so. Under Ray's own handler it ended as
    aborted (exit 134, a stack dump, no word of what was kept)."""


_SIGTERM: list[bool] = []  # set when one came: raised inside a Ray call, Ray turns Terminated into a KeyboardInterrupt


def _terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: a second must not cut the clean-up short
    _SIGTERM.append(True)
    raise Terminated


def _execute(name: str, module, args: argparse.Namespace) -> int:
    main = threading.current_thread() is threading.main_thread()
    _SIGTERM.clear()
    before = signal.signal(signal.SIGTERM, _terminated) if main else None  # kept over Ray's by jobs/ray_session.py
    try:
        return _run(name, module, args)
    finally:
        if main and before is not None:  # a caller's own (run_job from Python) again
            signal.signal(signal.SIGTERM, before)


def _run(name: str, module, args: argparse.Namespace) -> int:
    try:
        return module.run(args)
    except USER_ERRORS as err:
        if isinstance(err, BrokenPipeError) and _stdout_closed():
            # as a Unix tool killed by SIGPIPE: no message, status 128 + 13; what was printed was read, and the
            # jobs write their files before printing. Standard output goes to /dev/null so that the
            # interpreter's last flush at exit does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        if getattr(args, "debug", False):
            raise
        # one line: storage libraries (pyarrow's S3, for one) write several, with terminal colours
        line = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", redact_text(str(err))).split())[:1000]
        if name in RESUMABLE and getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            where = "there" if getattr(err, "filename", None) else "on its disk"
            line += f"; what was committed before it is kept: free space {where} and the same command resumes"
        elif name in RESUMABLE and stopped_answering(err):
            # storage that stopped answering mid-run (an S3 server gone, a network file system): not the
            # user's path, and nothing committed is lost
            line += "; what was committed before it is kept: the same command resumes once the storage answers again"
        print(f"ragsift {name}: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        # Ctrl-C is how a long run is paused: say what survives instead of a traceback from Ray's wait
        resumes = "; what was committed is kept, and the same command resumes from it" if name in RESUMABLE else ""
        # the handler marks every SIGTERM before it raises: whichever exception reached here, Terminated or Ray's
        how, status = ("terminated (SIGTERM)", 128 + signal.SIGTERM) if _SIGTERM else ("interrupted", 130)
        print(f"ragsift {name}: {how}{resumes}", file=sys.stderr)
        return status


def run_job(name: str, argv: list[str] | None = None) -> int:
    module = importlib.import_module(JOBS[name][0])
    return _execute(name, module, _parser(name, module).parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragsift", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="job", required=True)
    modules, parsers = {}, {}
    for name, (module_name, help_text) in JOBS.items():
        modules[name] = importlib.import_module(module_name)
        parsers[name] = _parser(name, modules[name], sub.add_parser(name, help=help_text, description=help_text))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the job's own parser: the top one printed `ragsift {demo,index,...}` as the usage
        parsers[args.job].error(f"unrecognized arguments: {' '.join(unknown)}")
    return _execute(args.job, modules[args.job], args)


if __name__ == "__main__":
    sys.exit(main())
