"""Exactly-once, resumable answer output, committed per input shard.

    <output>/_manifest.json                      what this output holds: input, shard size, config
    <output>/<strategy>/part-00000.parquet       the rows of input shard 0, for one strategy

A part is written as ``_part-NNNNN.parquet.tmp`` (a name dataset readers skip) and renamed once every
question of its shard has its row (an answer or an error row), so a part that exists is complete; its
sha256 and row count are written beside it (``_part-NNNNN.parquet.sha256``) just before the rename.
Re-running the same command resumes: committed parts are kept when their checksum matches (a damaged
part is named in the log and answered again; a part written before checksums existed is checked by its
footer only), leftovers of the interrupted run are removed, and only the unfinished shards are
answered. A different answer config is refused unless forced. ``--retry-errors`` opens the committed
parts that hold error rows again with their answered rows in them, so only the error rows are answered
again; the old part stays in place until the new one, whole, replaces it.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.questions import InputPlan, question_rows
from jobs.storage import file_sha256, filesystem, hash_ids, redact, write_whole
from schemas.config import ConfigError, answer_engine_kwargs
from schemas.tables import ANSWERS, conformed

MANIFEST = "_manifest.json"
LABELS = "labels"  # the label job's files (jobs/label.py), beside the answers
# what answer writes at a run's end (metrics, resolved config) and evaluate / compare beside it
DESCRIBING = ("metrics.json", "config.yaml", "eval.json", "eval.md", "eval.png", "resolution.json")


def in_progress(part: str) -> str:
    """Where a part is written until its commit: ``_part-NNNNN.parquet.tmp`` beside it, a name dataset
    readers skip, as the checksum's, so ``pq.read_table("out/rag")`` reads the committed parts of a run
    killed, failed or still answering (``part-NNNNN.parquet.tmp``, an earlier ragsift's, made it fail)."""
    folder, name = part.rsplit("/", 1)
    return f"{folder}/_{name}.tmp"


def part_of(tmp: str) -> str | None:
    """The part an in-progress file (this ragsift's name or an earlier one's) is written for, or None."""
    folder, name = tmp.rsplit("/", 1)
    name = name.removeprefix("_").removesuffix(".tmp") if name.endswith(".tmp") else ""
    return f"{folder}/{name}" if PART.fullmatch(name) else None


def checksum_path(part: str) -> str:
    """Beside each part, {"sha256", "rows"}; the leading underscore keeps dataset readers (pyarrow,
    Spark) from taking it for data."""
    folder, name = part.rsplit("/", 1)
    return f"{folder}/_{name}.sha256"
PART = re.compile(r"part-(\d{5,})\.parquet$")  # a committed part's name
# every name a run writes in a strategy's folder: a part, its .tmp, its checksum (and the checksum's .tmp, of
# an old part given new columns)
_OURS = re.compile(r"_?part-\d{5,}\.parquet(\.tmp|\.sha256(\.tmp)?)?")


@dataclass
class _Open:
    stream: pa.NativeFile
    writer: pq.ParquetWriter
    path: str
    rows: list[dict]
    written: int = 0


def claimed(output: str) -> bool:
    """Whether ``output`` holds a run already (its manifest)."""
    fs, root = filesystem(output)
    return fs.get_file_info(f"{root}/{MANIFEST}").type == pafs.FileType.File


# Identity fields compared only when both runs recorded them: the input's and the index's paths, which
# earlier versions recorded and which are now checked by content (a moved file resumes), and the input's
# digest and the judges' revisions, which those versions did not record (their outputs stay resumable, by
# rows and size, and by the judges' paths, as before).
JUDGE_REVISIONS = ("know.model_revision", "know.embedder_revision", "reranker.model_revision", "nli.model_revision")
RECORDED_BY_SOME = frozenset({"input.uri", "index.path", "input.sha256", *JUDGE_REVISIONS})


def changed_fields(previous: dict, current: dict, defaults: dict, speed=lambda key: False) -> list[str]:
    """Fields that differ between two run identities. A field the previous run did not record (a
    setting added by a later ragsift) counts only when the current value is not its default; a config
    field it recorded that the current identity leaves out has become a speed setting since (``speed``
    says so of a key inside a section, such as ``calibration.chosen.*``, which ``defaults`` cannot list). A
    pool's ``engine_kwargs`` are compared without their speed arguments, which the identity records as given.
    A section the current identity leaves out whole (one no strategy of the run reads: jobs/identity.py
    ``sections_unread``) is not compared: an output that recorded ``judge.model`` for a rag run resumes."""
    previous, current = _deciding(previous), _deciding(current)
    sections = {section_of(k) for k in current}
    return sorted(k for k in set(previous) | set(current)
                  if previous.get(k) != current.get(k)
                  and not (k in RECORDED_BY_SOME and (k not in previous or k not in current))
                  and not (k not in previous and current.get(k) == defaults.get(k, []))
                  and not (k not in current and (k in defaults or speed(k) or section_of(k) not in sections)))


def section_of(key: str) -> str:
    return key.split(".", 1)[0]


def _deciding(identity: dict) -> dict:
    return {key: answer_engine_kwargs(value) if key.endswith(".engine_kwargs") and isinstance(value, dict) else value
            for key, value in identity.items()}


REFUSED_HINT = "use another --output, or --force to discard it"
# identity fields whose name does not say which setting they come from
SAID_AS = {"input.rows": "input.rows (how many questions: --limit, or another questions file)"}


def said(fields: list[str]) -> str:
    return ", ".join(SAID_AS.get(f, f) for f in fields)


def check_resumable(output: str, identity: dict, defaults: dict, speed=lambda key: False, force: bool = False,
                    hint: str = REFUSED_HINT) -> list[str]:
    """The fields in which the run ``output`` holds differs from ``identity`` (none: a new output, or the same
    run to resume); a different run is refused unless ``force`` (which discards it), saying ``hint``."""
    return refused_unless_forced(output, recorded_identity(output), identity, defaults, speed, force, hint)


def recorded_identity(output: str) -> dict | None:
    """The identity the manifest of ``output`` records (None: a new output)."""
    fs, root = filesystem(output)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pafs.FileType.File:
        return None
    with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
        return json.loads(f.read())


def refused_unless_forced(output: str, previous: dict | None, identity: dict, defaults: dict, speed, force: bool,
                          hint: str = REFUSED_HINT) -> list[str]:
    """``check_resumable`` against the ``previous`` identity its manifest records."""
    changed = changed_fields(previous, identity, defaults, speed) if previous is not None else []
    if changed and not force:
        raise ConfigError(f"{redact(output)} holds output of a different run (differs in: {said(changed)}); {hint}")
    return changed


def unfinished(output: str, strategies: set[str] | None = None) -> str | None:
    """Which strategies of the run in ``output`` (of ``strategies``, where given) lack parts of input shards
    its manifest counts, in a sentence: a run killed, or one still answering. None for a finished run,
    and where no manifest says (one file named, a folder written by hand)."""
    fs, root = filesystem(output)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pafs.FileType.File:
        return None
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            manifest = json.loads(f.read())
        shards = -(-int(manifest["input.rows"]) // int(manifest["commit.shard_rows"]))
    except (KeyError, TypeError, ValueError):
        return None
    from strategies.registry import STRATEGIES

    short = {}
    for folder in fs.get_file_info(pafs.FileSelector(root)):
        strategy = folder.path.rsplit("/", 1)[-1]
        if folder.type != pafs.FileType.Directory or strategy.startswith("_") or strategy not in (strategies or {strategy}):
            continue
        names = [e.path.rsplit("/", 1)[-1] for e in fs.get_file_info(pafs.FileSelector(folder.path))]
        if strategy not in STRATEGIES and not any(_OURS.fullmatch(n) for n in names):
            continue  # not a strategy's answers: a label run's labels/, a folder of the user's
        committed = len({int(m.group(1)) for n in names if (m := PART.fullmatch(n))} & set(range(shards)))
        if committed < shards:
            short[strategy] = committed
    if not short:
        return None
    return (f"{redact(output)} is not finished (its run stopped, or is still answering): "
            + "; ".join(f"{s} has {n} of its {shards} parts" for s, n in sorted(short.items())))


CONVERSION_STALE_S = 3600.0  # a question file's conversion untouched this long was killed: no driver converts so slowly


def stale(info: pafs.FileInfo, age_s: float) -> bool:
    """Whether ``info``'s file was last written over ``age_s`` ago (a store that gives no time: not known, kept)."""
    return info.mtime is not None and time.time() - info.mtime.timestamp() > age_s


class ShardedOutput:
    def __init__(self, output: str, identity: dict, strategies: list[str], shard_rows: int,
                 row_group_rows: int = 1024, force: bool = False, log=print, defaults: dict | None = None,
                 guard=None, speed=lambda key: False, code: str | None = None, read_only: bool = False):
        self.fs, self.root = filesystem(output)
        self.output = output
        self.strategies = strategies
        self.shard_rows = shard_rows
        self.row_group_rows = row_group_rows
        self.identity = identity
        self.defaults = defaults or {}
        self.speed = speed  # whether an identity key is a speed setting (jobs/identity.py)
        self.log = log
        self.guard = guard  # called before each commit: raises when this driver lost the output (jobs/lease.py)
        # the code that wrote a part beside what decided it: a resume may change the code (not the identity)
        self.code = code
        self.schema = ANSWERS.with_metadata({"ragsift": json.dumps(identity, sort_keys=True),
                                             **({"ragsift_code": code} if code else {})})
        self.written_by: Counter = Counter()  # committed parts found, by the ragsift that wrote them
        self.open: dict[tuple[str, int], _Open] = {}
        self.expected: dict[int, int] = {}  # shard -> questions it holds (known once it is read)
        self.committed: set[tuple[str, int]] = set()
        self.retrying: dict[tuple[str, int], frozenset[str]] = {}  # reopened part -> the ids to answer again
        self.commits = 0
        self.error_rows: Counter = Counter()  # (strategy, why with its numbers as N) -> rows this session wrote
        # read_only: the committed parts of an output this process cannot write, checked as a resume checks them,
        # nothing written; a part it would delete and answer again is named in ``damaged`` instead
        self.read_only = read_only
        self.damaged: list[str] = []
        if read_only:
            self._check_read_only()
        else:
            self._prepare(force)

    # --- resume --------------------------------------------------------------------------------

    def _prepare(self, force: bool) -> None:
        self.fs.create_dir(self.root, recursive=True)
        manifest = f"{self.root}/{MANIFEST}"
        previous = recorded_identity(self.output)  # read once: checked, then carried into the new manifest
        changed = refused_unless_forced(self.output, previous, self.identity, self.defaults, self.speed, force)
        if changed:
            self.log(f"--force: discarding the previous output in {redact(self.output)} (differs in: {said(changed)})")
            for folder in self._folders():
                self._discard(folder)
            for name in DESCRIBING:  # they would describe the discarded answers until this run ends
                if self.fs.get_file_info(f"{self.root}/{name}").type == pafs.FileType.File:
                    self.fs.delete_file(f"{self.root}/{name}")
        record = self.identity
        if not changed:  # the sections this run leaves out keep what the runs before it recorded of them: a rag
            # run resumed in an output of rag and raisf must not erase raisf's settings, or a later raisf run with
            # others would pass this check and have the raisf parts answered again instead of being refused
            kept = {section_of(k) for k in self.identity}
            record = {**{k: v for k, v in (previous or {}).items() if section_of(k) not in kept}, **self.identity}
        with self.fs.open_output_stream(manifest + ".tmp") as f:
            f.write(json.dumps(record, indent=2, sort_keys=True).encode())
        self.fs.move(manifest + ".tmp", manifest)
        # a conversion of the questions killed before its rename (jobs/question_sources.py write_input); this
        # run's own was renamed before the lease it runs under was taken, but a second driver converts before
        # it asks for the lease, and lost its file mid-write (a traceback, not "another driver holds it")
        inputs = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/_input", allow_not_found=True))
        for left in inputs:
            if re.fullmatch(r"\.questions-[0-9a-f]+\.parquet\.tmp", left.base_name) and stale(left, CONVERSION_STALE_S):
                self.fs.delete_file(left.path)
        for strategy in self.strategies:
            self.fs.create_dir(f"{self.root}/{strategy}", recursive=True)
            entries = self._entries(strategy)
            finished = [self._finish_commit(path) for path in entries.values() if part_of(path)]
            if any(finished):
                entries = self._entries(strategy)
            for name, path in sorted(entries.items()):
                match = PART.fullmatch(name)
                if not _OURS.fullmatch(name):  # a notebook's checkpoints, a snapshot folder, a note: not ours
                    self.log(f"leaving {redact(self.output)}/{strategy}/{name} in place: not a file ragsift writes")
                elif match and (schema := self._valid(path)) is not None:
                    self._add_new_columns(path, schema)
                    self.committed.add((strategy, int(match.group(1))))
                elif not (name.startswith("_") and name.endswith(".sha256") and name[1:-7] in entries):
                    self.fs.delete_file(path)  # a leftover of an interrupted run, or a damaged part
                    if match and f"_{name}.sha256" in entries:
                        self.fs.delete_file(entries[f"_{name}.sha256"])
        self._say_who_wrote()

    def _check_read_only(self) -> None:
        for strategy in self.strategies:
            found = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{strategy}", allow_not_found=True))
            for path in sorted(e.path for e in found):
                if match := PART.fullmatch(path.rsplit("/", 1)[-1]):
                    if self._valid(path) is not None:
                        self.committed.add((strategy, int(match.group(1))))
                    else:
                        self.damaged.append(f"{strategy}/{path.rsplit('/', 1)[-1]}")

    def _say_who_wrote(self) -> None:
        """Parts committed by another ragsift than this one are kept (what decides the answers is the same
        run identity); said, since a code change between the two may answer some question otherwise."""
        others = {code: n for code, n in self.written_by.items() if code != self.code}
        if self.code and others:
            self.log(f"{sum(others.values())} committed part(s) were written by another ragsift ("
                     + ", ".join(f"{code or 'an earlier one, unrecorded'}: {n}" for code, n in others.items())
                     + f") and are kept; this one is {self.code}. Where the code changed an answer, the run holds both "
                     "(--force answers every question with this one)")

    def _add_new_columns(self, path: str, schema: pa.Schema) -> None:
        """Rewrite a part an earlier ragsift committed without columns added since (``n_truncated``), with
        them null: ``pq.read_table("out/rag")`` takes the first part's schema, so a resumed run whose first
        part was old lost the column of every row. Written as a commit is (in progress, its checksum, the
        rename), so a run killed meanwhile keeps the old part or finds the new one whole. ``schema``: the part's,
        as its check read it."""
        missing = [field.name for field in ANSWERS if field.name not in schema.names]
        if not missing:
            return
        with self.fs.open_input_file(path) as f:
            table = pq.read_table(f)
        columns = [table[c] if c in table.column_names else pa.nulls(table.num_rows, ANSWERS.field(c).type)
                   for c in ANSWERS.names]
        extra = [c for c in table.column_names if c not in ANSWERS.names]  # none that ragsift wrote: kept all the same
        table = pa.Table.from_arrays(columns + [table[c] for c in extra],
                                     schema=pa.schema([*ANSWERS, *(table.schema.field(c) for c in extra)],
                                                      metadata=schema.metadata))
        tmp = in_progress(path)
        with self.fs.open_output_stream(tmp) as out:
            pq.write_table(table, out, compression="zstd", row_group_size=self.row_group_rows)
        # whole or not at all: a checksum cut short would make the next run delete the part it describes
        write_whole(self.fs, checksum_path(path), json.dumps({"sha256": file_sha256(self.fs, tmp),
                                                               "rows": table.num_rows}).encode())
        self.fs.move(tmp, path)
        self.log(f"{redact(self.output)}/{path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}: written by an earlier "
                 f"ragsift, given its columns {missing} (null) so the folder reads as one table")

    def _entries(self, strategy: str) -> dict[str, str]:
        return {e.path.rsplit("/", 1)[-1]: e.path for e in self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{strategy}"))}

    def _finish_commit(self, tmp: str) -> bool:
        """Rename a part's ``.tmp`` whose checksum was written when the run stopped before the rename: it
        is whole (the checksum is taken of it), and where ``--retry-errors`` reopened the part the old
        one beside it no longer matches that checksum, so without this both would be lost."""
        part = part_of(tmp)
        try:
            with self.fs.open_input_stream(checksum_path(part)) as f:
                recorded = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return False
        if not isinstance(recorded, dict) or recorded.get("sha256") != file_sha256(self.fs, tmp):
            return False
        self.fs.move(tmp, part)
        self.log(f"finishing the commit of {redact(self.output)}/{part.rsplit('/', 2)[-2]}/"
                 f"{part.rsplit('/', 1)[-1]}, interrupted before its rename")
        return True

    def _folders(self) -> list[str]:
        """The output's folders but ``_input`` (the questions converted for this run, written before the
        output opens)."""
        return [name for e in self.fs.get_file_info(pafs.FileSelector(self.root))
                if e.type == pafs.FileType.Directory and not (name := e.path.rsplit("/", 1)[-1]).startswith("_")]

    def _discard(self, folder: str) -> None:
        """--force: the files a run writes in ``folder`` (parts, checksums, leftovers), and the folder once
        nothing else is in it. What ragsift did not write stays, named (before, the whole folder went: an
        index or a notebook kept in the output, a note beside the parts). A folder ragsift writes whole goes
        whole: the label job's ``labels`` (a discarded run's label files of a kind the new run does not collect
        stayed), and a run nested in this one (calibrate's ``decomposition_pass``, its own manifest in it)."""
        entries = self._entries(folder)
        if folder == LABELS or MANIFEST in entries:
            self.fs.delete_dir(f"{self.root}/{folder}")
            return
        ours = {name for name in entries if _OURS.fullmatch(name) and
                self.fs.get_file_info(entries[name]).type == pafs.FileType.File}
        for name in sorted(ours):
            self.fs.delete_file(entries[name])
        if left := sorted(set(entries) - ours):
            if ours:  # a folder ragsift never wrote in (an index, notes) is not said: it is simply not touched
                self.log(f"--force: leaving {', '.join(left)} in {redact(self.output)}/{folder}: not files ragsift writes")
        else:
            self.fs.delete_dir(f"{self.root}/{folder}")

    def _valid(self, path: str) -> pa.Schema | None:
        """The schema of a part of this run that is whole: its checksum matches, its footer reads, its identity
        agrees; None for any other. A read that fails for another reason (a storage service's 503, a permission)
        raises: deleting a part because the store hiccupped would answer its shard again for nothing."""
        name = f"{redact(self.output)}/{path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}"
        try:
            with self.fs.open_input_stream(checksum_path(path)) as f:
                recorded = json.loads(f.read())
        except FileNotFoundError:
            recorded = None  # written before parts had checksums: the footer check below is all there is
        except ValueError:
            recorded = {}  # not JSON: a damaged checksum file, so the part is not known to be whole
        if recorded is not None and file_sha256(self.fs, path) != (recorded.get("sha256") if isinstance(recorded, dict)
                                                                    else None):
            self.log(f"damaged part {name} (its checksum does not match){self._again}")
            return None
        with self.fs.open_input_file(path) as f:  # a storage error opening it raises
            try:
                schema = pq.ParquetFile(f).schema_arrow
                meta = schema.metadata or {}
                previous = json.loads(meta.get(b"ragsift", b"{}"))
                code = meta.get(b"ragsift_code", b"").decode(errors="replace") or None
            except (OSError, ValueError):  # pyarrow: ArrowInvalid, or OSError "Couldn't deserialize thrift"
                previous = None
        if previous is None:
            self.log(f"damaged part {name} (its footer does not read){self._again}")
            return None
        if changed_fields(previous, self.identity, self.defaults, self.speed):
            return None
        self.written_by[code] += 1
        return schema

    @property
    def _again(self) -> str:
        return "" if self.read_only else ": answering its shard again"

    def skip_shards(self) -> frozenset[int]:
        """Input shards that every strategy has committed already."""
        shards = [{s for st, s in self.committed if st == strategy} for strategy in self.strategies]
        return frozenset(set.intersection(*shards)) if shards else frozenset()

    def todo(self, strategy: str, shard: int, qid: str | None = None) -> bool:
        """Whether (strategy, question) still needs an answer: its part is not committed or, in a reopened
        part, its row was an error. ``qid`` None asks about the shard as a whole."""
        if (strategy, shard) in self.retrying:
            return qid is None or qid in self.retrying[(strategy, shard)]
        return (strategy, shard) not in self.committed

    def pairs_todo(self, shard_sizes: dict[int, int]) -> int:
        return sum(len(self.retrying[(s, shard)]) if (s, shard) in self.retrying else n
                   for shard, n in shard_sizes.items() for s in self.strategies if self.todo(s, shard))

    def reopen_errors(self) -> int:
        """Mark every committed part that holds error rows to be answered again: its answered rows are
        copied into its new part when the first of its answers comes (``_reopened``), so that answering its
        error rows commits it whole (the old part is replaced only then). Returns how many error rows are to
        be answered again."""
        # the ids and errors alone, and no part opened yet: reading parts whole (traces too) costs memory, and a
        # writer per part would hold a file open per part, past the open files a process may have
        for strategy, shard in sorted(self.committed):
            with self.fs.open_input_file(self._path(strategy, shard)) as f:
                table = pq.read_table(f, columns=["id", "error"])
            failed = pc.is_valid(table["error"])
            if pc.any(failed).as_py():
                self.committed.discard((strategy, shard))
                self.retrying[(strategy, shard)] = frozenset(table.filter(failed)["id"].to_pylist())
        return sum(map(len, self.retrying.values()))

    def _reopened(self, strategy: str, shard: int) -> _Open:
        """The new part of a part being answered again, holding the old part's answered rows."""
        with self.fs.open_input_file(self._path(strategy, shard)) as f:
            table = pq.read_table(f)
        kept = table.filter(pc.is_null(table["error"]))
        part = self._open(strategy, shard)
        part.writer.write_table(conformed(kept, self.schema))
        part.written = kept.num_rows
        return part

    # --- writing -------------------------------------------------------------------------------

    def sealed(self, shard: int, questions: int) -> None:
        """``shard`` holds ``questions`` rows per strategy (from the input plan): commit when written."""
        self.expected[shard] = questions
        for strategy in self.strategies:
            with self._writing(strategy, shard):
                self._maybe_commit(strategy, shard)

    def write(self, row: dict) -> None:
        key = (row["strategy"], row.pop("_shard"))
        if row.get("error"):
            self.error_rows[row["strategy"], re.sub(r"\d+", "N", row["error"][:200])] += 1
        with self._writing(*key):
            part = self.open.get(key) or (self._reopened(*key) if key in self.retrying else self._open(*key))
            part.rows.append(row)
            part.written += 1
            if len(part.rows) >= self.row_group_rows:
                self._flush(part)
            self._maybe_commit(*key)

    @contextmanager
    def _writing(self, strategy: str, shard: int):
        # pyarrow's write errors name no file ("[Errno 28] Error writing bytes to file"): the output, the
        # request cache and Ray's temp folder may each be on another disk
        try:
            yield
        except OSError as err:
            if err.errno is None or err.filename:
                raise
            raise OSError(err.errno, err.strerror or str(err), redact(self._path(strategy, shard))) from err

    def _path(self, strategy: str, shard: int) -> str:
        return f"{self.root}/{strategy}/part-{shard:05d}.parquet"

    def _open(self, strategy: str, shard: int) -> _Open:
        path = self._path(strategy, shard)
        stream = self.fs.open_output_stream(in_progress(path))
        part = _Open(stream, pq.ParquetWriter(stream, self.schema, compression="zstd"), path, [])
        self.open[(strategy, shard)] = part
        return part

    def _flush(self, part: _Open) -> None:
        if part.rows:
            part.writer.write_table(pa.Table.from_pylist(part.rows, schema=self.schema))
            part.rows.clear()

    def _maybe_commit(self, strategy: str, shard: int) -> None:
        if (strategy, shard) in self.committed or shard not in self.expected:
            return
        part = self.open.get((strategy, shard))
        if (part.written if part else 0) < self.expected[shard]:
            return
        part = part or self._open(strategy, shard)  # a shard whose rows were all dropped duplicates
        if self.guard:
            self.guard()
        self._flush(part)
        part.writer.close()
        part.stream.close()
        # before the rename, so a part never lacks it; whole or not at all, as the part it replaces (--retry-errors)
        # still needs its own: a run killed mid-write left it empty, and the resume deleted that good part
        write_whole(self.fs, checksum_path(part.path),
                    json.dumps({"sha256": file_sha256(self.fs, in_progress(part.path)), "rows": part.written}).encode())
        self.fs.move(in_progress(part.path), part.path)
        del self.open[(strategy, shard)]
        self.retrying.pop((strategy, shard), None)
        self.committed.add((strategy, shard))
        self.commits += 1

    def close(self) -> list[tuple[str, int]]:
        """Close the output; returns the (strategy, shard) parts left uncommitted (empty on success)."""
        left = sorted(self.open)
        for part in self.open.values():
            # a part left open is abandoned (a resume writes it anew), so a failure to close it (the disk
            # that stopped the run is still full) must not replace the error that stopped the run
            try:
                part.writer.close()
            except OSError:
                part.writer.is_open = False  # else its __del__ tries again and prints "Exception ignored"
            try:
                part.stream.close()
            except OSError:
                pass
        self.open.clear()
        return left

    # --- checking ------------------------------------------------------------------------------

    def files(self, strategy: str) -> list[str]:
        return sorted(self._path(strategy, s) for st, s in self.committed if st == strategy)

    def verify(self, plan: InputPlan, questions_uri: str, read_batch_rows: int, max_chars: int) -> dict:
        """Every answered input id appears exactly once per strategy (an answer or an error row).

        Shard by shard, so memory is bounded by one shard: the input's ids of a shard against the
        ids in that shard's part, for each strategy.
        """
        report = {s: {"rows": 0, "expected": 0, "duplicated": 0, "missing": 0, "unexpected": 0, "errors": 0, "ok": True}
                  for s in self.strategies}
        questions = question_rows(questions_uri, read_batch_rows, plan.rows, shard_rows=self.shard_rows,
                                  drop_rows=plan.duplicate_rows, max_chars=max_chars,
                                  null_id_prefix=plan.null_id_prefix)
        for shard, ids in _by_shard(questions, plan.shard_sizes(self.shard_rows)):
            expected = np.sort(hash_ids(ids))
            for strategy in self.strategies:
                r = report[strategy]
                path = self._path(strategy, shard)
                got, written = np.empty(0, np.uint64), []
                if (strategy, shard) in self.committed:
                    with self.fs.open_input_file(path) as f:
                        part = pq.read_table(f, columns=["id", "error"])
                    written = part["id"].to_pylist()
                    got = np.sort(hash_ids(written))
                    r["errors"] += part.num_rows - part["error"].null_count
                unique = np.unique(got)
                r["rows"] += len(got)
                r["expected"] += len(expected)
                r["duplicated"] += len(got) - len(unique)
                r["missing"] += len(np.setdiff1d(expected, unique))
                r["unexpected"] += len(np.setdiff1d(unique, expected))  # ids that are no question of this shard
                if not np.array_equal(got, expected):
                    r["ok"] = False
                    r["examples"] = (r.get("examples", []) + _examples(ids, written))[:3]
        return report


def check_failed(check: dict) -> str | None:
    """What ``verify``'s report finds wrong, in words ("rag: 0 missing, 1 duplicated, e.g. q3 2 times"); None
    where every strategy holds each question once."""
    wrong = [f"{s}: {c['missing']} missing, {c['duplicated']} duplicated"
             + (f", {c['unexpected']} not in the input" if c.get("unexpected") else "")
             + (f", e.g. {', '.join(c['examples'])}" if c.get("examples") else "")
             for s, c in check.items() if not c["ok"]]
    return "; ".join(wrong) or None


def _examples(ids: list[str], written: list[str]) -> list[str]:
    """A few ids that fail a shard's check, in words (the check compares their hashes)."""
    counts, asked = Counter(written), set(ids)
    return ([f"{i} {n} times" for i, n in counts.items() if n > 1] + [f"{i} not in the input" for i in counts
                                                                       if i not in asked]
            + [f"{i} missing" for i in ids if i not in counts])[:3]


def _by_shard(questions, shards):
    """(shard, ids) for every shard number in ``shards``, in order, including shards with no rows."""
    current, ids = None, []
    pending = iter(shards)
    for q in questions:
        if q.shard != current:
            if current is not None:
                yield current, ids
            for shard in pending:  # shards with no rows left (all dropped) still get checked
                if shard == q.shard:
                    break
                yield shard, []
            current, ids = q.shard, []
        ids.append(q.id)
    if current is not None:
        yield current, ids
    for shard in pending:
        yield shard, []
