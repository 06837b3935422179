import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import output as output_module
from jobs.output import ShardedOutput, check_failed
from jobs.questions import plan_input
from schemas.config import ConfigError
from schemas.tables import ANSWERS

IDENTITY = {"generator.model": "m", "input.rows": 5}


def row(qid, strategy, shard):
    return {**{n: None for n in ANSWERS.names}, "id": qid, "strategy": strategy, "answer": "a", "_shard": shard}


def test_a_part_commits_only_when_its_shard_is_complete(tmp_path):
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 3)
    out.sealed(1, 2)
    for qid, shard in [("q0", 0), ("q3", 1), ("q1", 0)]:
        out.write(row(qid, "rag", shard))
    assert out.committed == set() and len(list((tmp_path / "rag").glob("*.tmp"))) == 2
    out.write(row("q4", "rag", 1))  # shard 1 done first: out of order is fine
    assert out.committed == {("rag", 1)}
    out.write(row("q2", "rag", 0))
    assert out.close() == [] and out.committed == {("rag", 0), ("rag", 1)}
    assert pq.read_table(tmp_path / "rag" / "part-00000.parquet")["id"].to_pylist() == ["q0", "q1", "q2"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_resume_keeps_committed_parts_and_removes_leftovers(tmp_path):
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag", "direct"], shard_rows=3)
    out.sealed(0, 1)
    out.sealed(1, 1)
    out.write(row("q0", "rag", 0))
    out.write(row("q0", "direct", 0))
    out.write(row("q3", "rag", 1))
    out.close()  # the run dies here: shard 1 of `direct` never finished
    (tmp_path / "rag" / "part-00009.parquet").write_text("truncated junk")
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag", "direct"], shard_rows=3)
    assert again.committed == {("rag", 0), ("direct", 0), ("rag", 1)}
    assert again.skip_shards() == {0} and again.todo("direct", 1) and not again.todo("rag", 1)
    assert sorted(p.name for p in tmp_path.rglob("part-*")) == ["part-00000.parquet"] * 2 + ["part-00001.parquet"]
    assert sorted(p.name for p in tmp_path.rglob("_part-*")) == ["_part-00000.parquet.sha256"] * 2 + [
        "_part-00001.parquet.sha256"]
    assert pq.read_table(tmp_path / "rag")["id"].to_pylist() == ["q0", "q3"]  # readers skip the checksums


def test_a_part_damaged_inside_is_named_and_answered_again(tmp_path):
    """Before, 40 bytes overwritten inside the answer column survived a resume (only the footer was checked)."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.sealed(1, 1)
    out.write(row("q0", "rag", 0))
    out.write(row("q3", "rag", 1))
    out.close()
    part = tmp_path / "rag" / "part-00000.parquet"
    data = bytearray(part.read_bytes())
    data[40:80] = b"x" * 40  # inside the data pages; the footer still reads
    part.write_bytes(bytes(data))
    pq.ParquetFile(part)
    log = []
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3, log=log.append)
    assert again.committed == {("rag", 1)} and again.todo("rag", 0)
    assert any("damaged part" in line and "rag/part-00000.parquet" in line for line in log)
    assert not part.exists() and not (tmp_path / "rag" / "_part-00000.parquet.sha256").exists()


class FlakyStore:
    """A filesystem whose reads of checksum files fail as a storage service does under load."""

    def __init__(self, fs):
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open_input_stream(self, path):
        if path.endswith(".sha256"):
            raise OSError("When reading information for key 'rag/_part-00000.parquet.sha256': AWS Error SLOW_DOWN")
        return self.fs.open_input_stream(path)


def test_a_storage_error_while_checking_a_part_stops_the_resume_and_deletes_nothing(tmp_path, monkeypatch):
    """Before, any OSError reading a part's checksum counted as damage and the part was deleted."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    real = output_module.filesystem
    monkeypatch.setattr(output_module, "filesystem", lambda uri: (FlakyStore(real(uri)[0]), real(uri)[1]))
    with pytest.raises(OSError, match="SLOW_DOWN"):
        ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    monkeypatch.undo()
    assert ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3).committed == {("rag", 0)}


def test_a_different_number_of_questions_is_refused_naming_the_limit(tmp_path):
    """`ragsift demo --limit 4` into a `--limit 3` demo said "differs in: input.rows", naming no setting."""
    ShardedOutput(str(tmp_path), {**IDENTITY, "input.rows": 3}, ["rag"], shard_rows=3).sealed(0, 1)
    with pytest.raises(ConfigError, match=r"differs in: input.rows \(how many questions: --limit"):
        ShardedOutput(str(tmp_path), {**IDENTITY, "input.rows": 4}, ["rag"], shard_rows=3)


def test_a_different_run_is_refused_unless_forced(tmp_path):
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    changed = {**IDENTITY, "generator.model": "other"}
    with pytest.raises(ConfigError, match="differs in: generator.model"):
        ShardedOutput(str(tmp_path), changed, ["rag"], shard_rows=3)
    (tmp_path / "_input").mkdir()  # this run's questions, converted (hf:, a datasets folder...) before the output opens
    (tmp_path / "_input" / "questions.parquet").write_bytes(b"converted")
    for name in ("metrics.json", "config.yaml", "eval.json", "eval.md", "eval.png", "resolution.json"):
        (tmp_path / name).write_text("of the run --force discards")
    forced = ShardedOutput(str(tmp_path), changed, ["rag"], shard_rows=3, force=True, log=lambda *_: None)
    assert forced.committed == set() and not list((tmp_path / "rag").iterdir())
    assert (tmp_path / "_input" / "questions.parquet").read_bytes() == b"converted"
    # before, they stayed: a forced run stopped early left eval.md and metrics.json of the discarded answers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_input", "_manifest.json", "rag"]


def test_a_setting_added_later_keeps_old_output_resumable_while_it_has_its_default(tmp_path):
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    newer = {**IDENTITY, "nli.model": None}
    again = ShardedOutput(str(tmp_path), newer, ["rag"], shard_rows=3, defaults={"nli.model": None})
    assert again.committed == {("rag", 0)}
    with pytest.raises(ConfigError, match="differs in: nli.model"):
        ShardedOutput(str(tmp_path), {**newer, "nli.model": "some-nli"}, ["rag"], shard_rows=3,
                      defaults={"nli.model": None})


def test_verify_counts_missing_and_duplicated_ids(tmp_path):
    q = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "a"], "question": ["?"] * 4}), q)
    plan = plan_input(str(q))
    out = ShardedOutput(str(tmp_path / "out"), IDENTITY, ["rag"], shard_rows=10)
    out.sealed(0, 3)
    for qid in ["a", "b", "c"]:
        out.write(row(qid, "rag", 0))
    out.close()
    assert out.verify(plan, str(q), 2, 100)["rag"] == {"rows": 3, "expected": 3, "duplicated": 0, "missing": 0,
                                                      "unexpected": 0, "errors": 0, "ok": True}
    bad = ShardedOutput(str(tmp_path / "bad"), IDENTITY, ["rag"], shard_rows=10)
    bad.sealed(0, 3)
    for qid in ["a", "b", "b"]:
        bad.write(row(qid, "rag", 0))
    assert bad.verify(plan, str(q), 2, 100)["rag"] == {"rows": 3, "expected": 3, "duplicated": 1, "missing": 1,
                                                      "unexpected": 0, "errors": 0, "ok": False,
                                                      "examples": ["b 2 times", "c missing"]}
    # an id that is no question of the input: before, its report said nothing was missing or duplicated
    other = ShardedOutput(str(tmp_path / "other"), IDENTITY, ["rag"], shard_rows=10)
    other.sealed(0, 3)
    for qid in ["a", "b", "z"]:
        other.write(row(qid, "rag", 0))
    check = other.verify(plan, str(q), 2, 100)
    assert (check["rag"]["missing"], check["rag"]["unexpected"], check["rag"]["ok"]) == (1, 1, False)
    assert check_failed(check) == "rag: 1 missing, 0 duplicated, 1 not in the input, e.g. z not in the input, c missing"
    assert check_failed({}) is None


def test_a_questions_file_edited_to_the_same_size_is_another_input(tmp_path):
    """Before, the identity held the input's path, rows and size only: an edit of one question that kept
    the file's size resumed, and the edited question kept its old answer."""
    from jobs.identity import run_identity
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["What is number 2?", "Who?"]}), questions)
    config = AnswerConfig(questions=str(questions), output=str(tmp_path / "out"), strategies=["direct"])
    out = ShardedOutput(str(tmp_path / "out"), run_identity(config, plan_input(str(questions))), ["direct"], 10)
    out.sealed(0, 2)
    out.write(row("q0", "direct", 0))
    out.write(row("q1", "direct", 0))
    out.close()
    size = questions.stat().st_size
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["What is number 7?", "Who?"]}), questions)
    assert questions.stat().st_size == size
    with pytest.raises(ConfigError, match="differs in: input.sha256"):
        ShardedOutput(str(tmp_path / "out"), run_identity(config, plan_input(str(questions))), ["direct"], 10)


def test_the_same_questions_and_index_moved_elsewhere_resume(tmp_path):
    """The identity names the input and the index by content: a copy of the questions at another path,
    or the index at another path, resumes (the index's path was refused before)."""
    from jobs.identity import identity_defaults, run_identity
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)
    config = AnswerConfig(questions=str(questions), output=str(tmp_path / "out"), strategies=["direct"],
                          index={"path": str(tmp_path / "idx")})
    out = ShardedOutput(str(tmp_path / "out"), run_identity(config, plan_input(str(questions))), ["direct"], 10)
    out.sealed(0, 1)
    out.write(row("q0", "direct", 0))
    out.close()
    moved = tmp_path / "elsewhere.parquet"
    moved.write_bytes(questions.read_bytes())
    config = config.model_copy(update={"questions": str(moved), "index": config.index.model_copy(
        update={"path": str(tmp_path / "idx2")})})
    again = ShardedOutput(str(tmp_path / "out"), run_identity(config, plan_input(str(moved))), ["direct"], 10,
                          defaults=identity_defaults())
    assert again.committed == {("direct", 0)}


def test_a_search_setting_no_shard_reads_is_no_part_of_the_identity_and_one_recorded_before_still_resumes(
        tmp_path, monkeypatch):
    """nprobe on a Flat index (FAISS reads it only on IVF shards) refused the resume it could not change."""
    from jobs import identity as identity_module
    from jobs.identity import identity_defaults, run_identity
    from strategies.registry import AnswerConfig

    factories = {str(tmp_path / "flat"): "Flat", str(tmp_path / "ivf"): "IVF64,Flat"}
    monkeypatch.setattr(identity_module, "manifest_sha256", lambda path: f"sha-{path}")
    monkeypatch.setattr(identity_module, "read_manifest", lambda path: {"shards": [{"factory": factories[path]}]})
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)

    def identity(index, nprobe):
        config = AnswerConfig(questions=str(questions), strategies=["rag"],
                              index={"path": str(tmp_path / index), "nprobe": nprobe})
        return run_identity(config, plan_input(str(questions)))

    assert "index.nprobe" not in identity("flat", 8) and identity("flat", 8) == identity("flat", 64)
    assert identity("ivf", 8)["index.nprobe"] == 8 and "index.hnsw_ef_search" not in identity("ivf", 8)
    recorded = {**identity("flat", 8), "index.nprobe": 32}  # as a run before this change recorded it
    out = ShardedOutput(str(tmp_path / "out"), recorded, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    again = ShardedOutput(str(tmp_path / "out"), identity("flat", 64), ["rag"], shard_rows=3, defaults=identity_defaults())
    assert again.committed == {("rag", 0)}


def test_how_the_index_was_built_is_no_part_of_the_identity_and_an_output_that_recorded_it_still_resumes(
        tmp_path, monkeypatch):
    """A run searches its index as built (its manifest's digest is in the identity) and encodes queries with the
    index's embedder: a resume after `--set index.chunk_words=100` was refused, and --force threw away answers
    that would have come out the same."""
    from jobs import identity as identity_module
    from jobs.identity import identity_defaults, run_identity
    from strategies.registry import AnswerConfig

    monkeypatch.setattr(identity_module, "manifest_sha256", lambda path: "sha-of-the-manifest")
    monkeypatch.setattr(identity_module, "read_manifest", lambda path: {"shards": [{"factory": "Flat"}]})
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)

    def identity(**settings):
        config = AnswerConfig(questions=str(questions), strategies=["rag"], embedder={"model": settings.pop("embedder")},
                              index={"path": str(tmp_path / "idx"), **settings})
        return run_identity(config, plan_input(str(questions)))

    built = identity(embedder="all-minilm-l6-v2")
    assert built == identity(embedder="bge-small", chunk_words=100, index_type="hnsw", nlist=8, pq_m=8, pq_bits=4,
                             hnsw_m=8, train_sample=2000, bm25=False, bm25_k1=1.2, bm25_b=0.7)
    assert built["index.manifest_sha256"] == "sha-of-the-manifest"
    # as a run before this change recorded them
    recorded = {**built, "embedder.model": "all-minilm-l6-v2", "index.index_type": "flat", "index.chunk_words": 100}
    out = ShardedOutput(str(tmp_path / "out"), recorded, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    again = ShardedOutput(str(tmp_path / "out"), built, ["rag"], shard_rows=3, defaults=identity_defaults())
    assert again.committed == {("rag", 0)}


def test_an_output_recorded_with_the_input_path_before_digests_existed_still_resumes(tmp_path):
    old = {**IDENTITY, "input.uri": "/data/q.parquet", "index.path": "/idx"}
    out = ShardedOutput(str(tmp_path), old, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    again = ShardedOutput(str(tmp_path), {**IDENTITY, "input.sha256": "ab" * 32}, ["rag"], shard_rows=3)
    assert again.committed == {("rag", 0)}


def test_how_the_engine_rides_out_failures_may_change_on_resume():
    from jobs.identity import operational

    for key in ("engine.fail_fast_after", "engine.failure_cooldown_s", "engine.replica_max_restarts",
                "engine.max_attempts", "index.path"):
        assert operational(key), key
    assert not operational("engine.max_nodes_per_root")


def resumed_after_a_killed_retry(tmp_path, killing) -> tuple[ShardedOutput, list[str], pa.Table]:
    """--retry-errors of one committed part (q0 answered, q1 an error row), killed where ``killing`` (a
    filesystem wrapper) raises while it answers q1; then the resume, what it logged and the part it keeps."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 2)
    out.write(row("q0", "rag", 0))
    out.write({**row("q1", "rag", 0), "error": "boom"})
    retry = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    assert retry.reopen_errors() == 1
    retry.sealed(0, 2)
    retry.fs = killing(retry.fs)
    with pytest.raises(KeyboardInterrupt):
        retry.write(row("q1", "rag", 0))
    logged = []
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3, log=logged.append)
    assert not list(tmp_path.rglob("*.tmp"))
    return again, logged, pq.read_table(tmp_path / "rag")


class Wrapped:
    def __init__(self, fs):
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)


def test_a_commit_interrupted_before_its_rename_is_finished_on_resume(tmp_path):
    """--retry-errors rewrote a part: its checksum was written, then the run stopped before the rename.
    Before, the old part no longer matched the new checksum and was deleted with the new .tmp: the
    shard's good rows were answered again."""
    class StopsAtTheRename(Wrapped):
        def move(self, src, dest):
            if src.endswith(".sha256.tmp"):  # the checksum is moved into place first
                return self.fs.move(src, dest)
            raise KeyboardInterrupt

    again, logged, table = resumed_after_a_killed_retry(tmp_path, StopsAtTheRename)
    assert again.committed == {("rag", 0)} and "interrupted before its rename" in logged[0]
    assert table["id"].to_pylist() == ["q0", "q1"] and table["error"].to_pylist() == [None, None]


def test_a_strategy_folder_reads_as_its_committed_parts_while_others_are_still_written(tmp_path):
    """README's `pq.read_table("out/rag")` failed on a part in progress ("Parquet magic bytes not found in
    footer" of part-00001.parquet.tmp): after a kill, a failed run, or while a run answers."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.sealed(1, 3)
    out.write(row("q3", "rag", 1))
    out.open[("rag", 1)].writer.write_table(pa.Table.from_pylist(out.open[("rag", 1)].rows, schema=out.schema))
    assert (tmp_path / "rag" / "_part-00001.parquet.tmp").exists()
    assert pq.read_table(tmp_path / "rag")["id"].to_pylist() == ["q0"]


def test_a_resume_finishes_or_removes_parts_in_progress_of_either_name_and_killed_conversions(tmp_path):
    """An earlier ragsift wrote part-NNNNN.parquet.tmp; a conversion of the questions killed before its rename
    left _input/.questions-<uuid>.parquet.tmp behind for good."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    (tmp_path / "rag" / "part-00001.parquet.tmp").write_bytes(b"an earlier ragsift's leftover")
    (tmp_path / "rag" / "_part-00002.parquet.tmp").write_bytes(b"a leftover")
    (tmp_path / "_input").mkdir()
    killed = tmp_path / "_input" / ".questions-0123abcd.parquet.tmp"
    killed.write_bytes(b"a killed conversion")
    os.utime(killed, (time.time() - 7200, time.time() - 7200))
    # a second driver's, converting now before it asks for the lease (which names this one): its file stays
    (tmp_path / "_input" / ".questions-4567cdef.parquet.tmp").write_bytes(b"a conversion under way")
    (tmp_path / "_input" / "questions-0123456789abcdef.parquet").write_bytes(b"the questions")
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    assert again.committed == {("rag", 0)}
    assert sorted(p.name for p in (tmp_path / "rag").iterdir()) == ["_part-00000.parquet.sha256", "part-00000.parquet"]
    assert sorted(p.name for p in (tmp_path / "_input").iterdir()) == [".questions-4567cdef.parquet.tmp",
                                                                       "questions-0123456789abcdef.parquet"]


def test_an_output_recorded_when_the_failure_settings_were_part_of_the_identity_still_resumes(tmp_path):
    """engine.max_attempts and the like became speed settings: an output recording them was refused."""
    from jobs.identity import identity_defaults

    old = {**IDENTITY, "engine.max_attempts": 3, "engine.fail_fast_after": 64}
    out = ShardedOutput(str(tmp_path), old, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3, defaults=identity_defaults())
    assert again.committed == {("rag", 0)}


def test_a_run_resumed_under_another_calibration_record_with_the_same_thresholds_resumes(tmp_path):
    """The record names where the thresholds came from; the thresholds are their sections' fields. A
    resume with the same values, calibrated again from a moved copy of the slice, was refused ("differs in:
    calibration.questions"), and --force threw the answers away; so was an output whose identity recorded
    the record (before it was known to decide nothing)."""
    from jobs.identity import identity_defaults, operational, run_identity
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)

    def config(slice_path, threshold=0.5):
        record = {"questions": slice_path, "questions_sha256": "ab" * 32, "n": 12, "generator": "g", "ranker": "r",
                  "chosen": {"raisf.know_threshold": threshold}}
        return AnswerConfig(questions=str(questions), strategies=["raisf"], raisf={"know_threshold": threshold},
                            calibration=record)

    def output(cfg, identity=None):
        return ShardedOutput(str(tmp_path / "out"), identity or run_identity(cfg, plan_input(str(questions))),
                             ["direct"], 10, defaults=identity_defaults(), speed=operational)

    first = run_identity(config("/a/calib.parquet"), plan_input(str(questions)))
    old = {**first, "calibration.questions": "/a/calib.parquet", "calibration.chosen.raisf.know_threshold": 0.5}
    out = output(None, old)  # as an earlier ragsift recorded it
    out.sealed(0, 1)
    out.write(row("q0", "direct", 0))
    out.close()
    assert output(config("/b/calib.parquet")).committed == {("direct", 0)}
    with pytest.raises(ConfigError, match="differs in: raisf.know_threshold"):
        output(config("/b/calib.parquet", threshold=0.6))


def judged_output(tmp_path, strategies=("direct", "raisf"), **judges):
    """An output of one committed row answered under ``judges`` (AnswerConfig sections) by ``strategies``, and a
    function that opens it again as a rerun with ``judges`` would, from its config or from a given identity."""
    from jobs.identity import identity_defaults, operational, run_identity
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)

    def output(identity=None):
        config = AnswerConfig(questions=str(questions), strategies=list(strategies), **judges)
        return ShardedOutput(str(tmp_path / "out"), identity or run_identity(config, plan_input(str(questions))),
                             ["direct"], 10, defaults=identity_defaults(), speed=operational)

    return output


def commit_one(out):
    out.sealed(0, 1)
    out.write(row("q0", "direct", 0))
    out.close()


def test_a_run_resumed_after_its_judge_was_retrained_into_the_same_folder_is_refused_naming_it(tmp_path):
    """The identity held the judges' paths only: a resume after `ragsift train` wrote a new model into the
    same folder mixed the old model's judgments and the new one's in one output."""
    m_rel, m_know = tmp_path / "m_rel", tmp_path / "m_know"
    for folder, files in ((m_rel, ("config.json", "model.safetensors", "relevance_logit.json")), (m_know, ("know.json",))):
        folder.mkdir()
        for name in files:
            (folder / name).write_text('{"embedder": "all-minilm-l6-v2"}' if name == "know.json" else "v1")
    output = judged_output(tmp_path, reranker={"model": str(m_rel)}, know={"model": str(m_know)},
                           raisf={"judges": "trained"})
    commit_one(output())
    assert output().committed == {("direct", 0)}  # the same files: it resumes
    (m_rel / "model.safetensors").write_text("v2, retrained")
    with pytest.raises(ConfigError, match="differs in: reranker.model_revision"):
        output()
    (m_rel / "model.safetensors").write_text("v1")
    (m_know / "know.json").write_text('{"embedder": "all-minilm-l6-v2", "coef": [1.0]}')
    with pytest.raises(ConfigError, match="differs in: .*know.model_revision"):
        output()


def test_a_judge_no_strategy_of_the_run_asks_is_no_part_of_its_identity(tmp_path):
    """A shipped trained-judges config names know.model and reranker.model: a rag run with it as a base, or
    RA-ISF judged by the generator, was refused on resume after M_know was retrained, though no M_know ran."""
    m_know = tmp_path / "m_know"
    m_know.mkdir()
    (m_know / "know.json").write_text('{"embedder": "all-minilm-l6-v2"}')
    for strategies, raisf in ((("direct", "rag"), {}), (("raisf",), {"judges": "generator"})):
        (m_know / "know.json").write_text('{"embedder": "all-minilm-l6-v2"}')
        (folder := tmp_path / "_".join(strategies)).mkdir()
        output = judged_output(folder, strategies, know={"model": str(m_know)}, raisf=raisf)
        assert "know.model_revision" not in output().identity
        commit_one(output())
        (m_know / "know.json").write_text('{"embedder": "all-minilm-l6-v2", "coef": [2.0]}')  # retrained
        assert output().committed == {("direct", 0)}


def test_an_output_written_before_the_judges_revisions_were_recorded_still_resumes(tmp_path):
    """Outputs of earlier versions recorded the judges' paths only; as do runs of hub-named judges, whose
    revision is their name."""
    from jobs.output import JUDGE_REVISIONS

    m_rel = tmp_path / "m_rel"
    m_rel.mkdir()
    (m_rel / "config.json").write_text("{}")
    output = judged_output(tmp_path, ("direct", "migres"), reranker={"model": str(m_rel)},
                           nli={"model": "cross-encoder/nli-deberta-v3-base"})
    now = output().identity
    assert now["nli.model_revision"] == "cross-encoder/nli-deberta-v3-base"
    assert set(JUDGE_REVISIONS) & set(now) == {"reranker.model_revision", "nli.model_revision"}  # MIGRES asks no M_know
    commit_one(output({k: v for k, v in now.items() if k not in JUDGE_REVISIONS}))
    assert output().committed == {("direct", 0)}


def test_a_retry_killed_while_writing_its_checksum_keeps_the_part_it_was_replacing(tmp_path):
    """--retry-errors rewrote a part and was killed while writing its checksum. Before, the checksum was
    written in place: the committed part's own was left empty, and the resume deleted that good part."""
    class KilledWritingTheChecksum(Wrapped):
        def open_output_stream(self, path, *args, **kwargs):
            stream = self.fs.open_output_stream(path, *args, **kwargs)  # opened, so emptied: then the kill
            if ".sha256" in path:
                stream.close()
                raise KeyboardInterrupt
            return stream

    again, logged, table = resumed_after_a_killed_retry(tmp_path, KilledWritingTheChecksum)
    assert again.committed == {("rag", 0)}, logged
    assert table["id"].to_pylist() == ["q0", "q1"] and table["error"].to_pylist() == [None, "boom"]


def test_force_discards_the_files_a_run_wrote_and_leaves_what_it_did_not(tmp_path):
    """Before, --force deleted every folder of the output: an index or notes kept there, a note beside
    the parts, a notebook's checkpoints."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag", "direct"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.write(row("q0", "direct", 0))
    (tmp_path / "index" / "shard-000").mkdir(parents=True)
    (tmp_path / "index" / "manifest.json").write_text("{}")
    (tmp_path / "rag" / "NOTES.txt").write_text("mine")
    (tmp_path / "rag" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "rag" / "_part-00001.parquet.tmp").write_bytes(b"a leftover")
    (tmp_path / "labels").mkdir()  # the label job's files and a run nested in this one go whole, as before
    (tmp_path / "labels" / "relevance.parquet").write_bytes(b"labels of the discarded run")
    (tmp_path / "decomposition_pass" / "raisf").mkdir(parents=True)
    (tmp_path / "decomposition_pass" / "_manifest.json").write_text("{}")
    said = []
    forced = ShardedOutput(str(tmp_path), {**IDENTITY, "generator.model": "other"}, ["rag"], shard_rows=3,
                           force=True, log=said.append)
    assert forced.committed == set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_manifest.json", "index", "rag"]  # direct/ was all ours
    assert (tmp_path / "index" / "manifest.json").read_text() == "{}" and (tmp_path / "index" / "shard-000").is_dir()
    assert sorted(p.name for p in (tmp_path / "rag").iterdir()) == [".ipynb_checkpoints", "NOTES.txt"]
    assert any(".ipynb_checkpoints, NOTES.txt in" in line and "not files ragsift writes" in line for line in said)


def test_what_ragsift_did_not_write_in_a_strategy_folder_is_left_there_and_does_not_stop_a_resume(tmp_path):
    """Before, a `.ipynb_checkpoints` folder in rag/ stopped every resume ("Cannot delete file ... Is a
    directory"), and a note beside the parts was deleted without a word."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    (tmp_path / "rag" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "rag" / "NOTES.txt").write_text("mine")
    (tmp_path / "rag" / "part-00001.parquet.tmp").write_bytes(b"a run's leftover")
    said = []
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3, log=said.append)
    assert again.committed == {("rag", 0)}
    assert sorted(p.name for p in (tmp_path / "rag").iterdir()) == [
        ".ipynb_checkpoints", "NOTES.txt", "_part-00000.parquet.sha256", "part-00000.parquet"]
    assert any("NOTES.txt in place" in line for line in said)


def test_a_full_disk_names_the_part_it_was_writing_and_closing_the_output_keeps_that_error(tmp_path, monkeypatch):
    """ENOSPC while a part was written: the error named no file, and closing the output after it (the disk
    still full) raised again from the first part it could not close, replacing the error, while the parts
    it never reached printed "Exception ignored in ParquetWriter.__del__" tracebacks."""
    import errno
    import gc

    class FullDisk(pq.ParquetWriter):
        def write_table(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

        def close(self):
            if self.is_open:
                raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(output_module.pq, "ParquetWriter", FullDisk)
    out = ShardedOutput(str(tmp_path), IDENTITY, ["direct", "rag"], shard_rows=2, row_group_rows=1)
    with pytest.raises(OSError) as raised:
        out.write(row("q0", "rag", 0))
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == f"{tmp_path}/rag/part-00000.parquet"
    assert "No space left on device" in str(raised.value)
    out.open[("direct", 1)] = out._open("direct", 1)  # another part open when the run stopped
    assert out.close() == [("direct", 1), ("rag", 0)]  # closing reports what is left, raising nothing
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    gc.collect()
    assert unraisable == []


def test_a_runs_config_yaml_names_local_paths_absolutely_so_it_reruns_from_any_folder(tmp_path, monkeypatch):
    """`questions: data/q.parquet` as typed: `--config out/config.yaml` from another folder did not find it."""
    import yaml

    from jobs.answer import write_record
    from strategies.registry import AnswerConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    write_record(AnswerConfig(questions="data/q.parquet", output="out", index={"path": "idx"}), {})
    written = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert (written["questions"], written["output"], written["index"]["path"]) == (
        str(tmp_path / "data/q.parquet"), str(tmp_path / "out"), str(tmp_path / "idx"))
    write_record(AnswerConfig(questions="s3://b/q.parquet", output="out"), {})
    written = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert written["questions"] == "s3://b/q.parquet"


def test_a_leading_tilde_is_the_home_folder_in_every_local_path_and_in_the_record(tmp_path, monkeypatch):
    """pyarrow expanded `~` in the questions and the output, ragsift did not: `output: ~/runs` was written under
    $HOME and recorded as <cwd>/~/runs (a `--config` rerun found nothing), `index: {path: ~/idx}` was not found
    and `cache.path: ~/c.sqlite` was recorded elsewhere than the file used."""
    import yaml

    from jobs.answer import write_record
    from jobs.index import IndexJobConfig
    from strategies.registry import AnswerConfig

    home = tmp_path / "home"
    (home / "out").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    config = AnswerConfig(questions="~/q.parquet", output="~/out", index={"path": "~/idx"}, cache={"path": "~/c.sqlite"})
    assert (config.questions, config.output, config.index.path, config.cache.path) == (
        str(home / "q.parquet"), str(home / "out"), str(home / "idx"), str(home / "c.sqlite"))
    write_record(config, {})
    written = yaml.safe_load((home / "out" / "config.yaml").read_text())
    assert (written["questions"], written["output"], written["index"]["path"], written["cache"]["path"]) == (
        str(home / "q.parquet"), str(home / "out"), str(home / "idx"), str(home / "c.sqlite"))
    assert IndexJobConfig(corpus="~/c.parquet", index={"path": "~/idx"}).corpus == str(home / "c.parquet")
    assert AnswerConfig(questions="s3://b/~q.parquet", output="out~").questions == "s3://b/~q.parquet"


def test_a_part_an_earlier_ragsift_wrote_without_a_later_column_gets_it_null_so_the_folder_reads_as_one_table(tmp_path):
    """A run resumed after an upgrade held old parts without `n_truncated` beside new ones with it, and
    pq.read_table("out/rag") took the first part's schema: every row's n_truncated was dropped."""
    import json

    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1)
    out.sealed(0, 1)
    out.write({**row("q0", "rag", 0), "n_truncated": 0})
    out.close()
    part = tmp_path / "rag" / "part-00000.parquet"
    old = pq.read_table(part).drop_columns(["n_truncated"])  # as a ragsift of before the column wrote it
    pq.write_table(old, part)
    (tmp_path / "rag" / "_part-00000.parquet.sha256").write_text(json.dumps({
        "sha256": output_module.file_sha256(*output_module.filesystem(str(part))), "rows": 1}))
    lines = []
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1, log=lines.append)
    assert again.committed == {("rag", 0)} and any("given its columns ['n_truncated']" in line for line in lines)
    again.sealed(1, 1)
    again.write({**row("q1", "rag", 1), "n_truncated": 2})
    again.close()
    table = pq.read_table(tmp_path / "rag")
    assert table["n_truncated"].to_pylist() == [None, 2] and table.schema.metadata == old.schema.metadata
    assert ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1).committed == {("rag", 0), ("rag", 1)}
    (tmp_path / "rag" / "_part-00000.parquet.sha256.tmp").write_text("{")  # a rewrite killed writing its checksum
    lines.clear()
    assert ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1, log=lines.append).committed == {
        ("rag", 0), ("rag", 1)}
    assert not (tmp_path / "rag" / "_part-00000.parquet.sha256.tmp").exists() and lines == []


def test_a_resume_by_another_ragsift_keeps_its_parts_and_says_which_wrote_them(tmp_path):
    """Parts of a run started by one version and resumed by another were mixed without a word."""
    first = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1, code="0.1.0+git.aaaa")
    first.sealed(0, 1)
    first.write(row("q0", "rag", 0))
    first.close()
    assert pq.read_schema(tmp_path / "rag" / "part-00000.parquet").metadata[b"ragsift_code"] == b"0.1.0+git.aaaa"
    lines = []
    same = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1, code="0.1.0+git.aaaa", log=lines.append)
    assert same.committed == {("rag", 0)} and lines == []
    other = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=1, code="0.1.0+git.bbbb", log=lines.append)
    assert other.committed == {("rag", 0)}
    assert any("1 committed part(s) were written by another ragsift (0.1.0+git.aaaa: 1)" in line
               and "this one is 0.1.0+git.bbbb" in line for line in lines)


def test_this_ragsift_names_its_version_and_in_a_checkout_its_commit():
    import subprocess
    from importlib.metadata import version
    from pathlib import Path

    from jobs.identity import code_version

    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    assert code_version() == f"{version('ragsift')}+git.{head.stdout.strip()}"


def test_a_resume_may_change_an_engine_argument_that_only_changes_speed_and_not_one_that_changes_answers(tmp_path):
    """`generator.engine_kwargs.max_num_seqs` raised to fill a GPU refused the resume of the run it was to speed up."""
    written = {**IDENTITY, "generator.engine_kwargs": {"max_num_seqs": 8, "quantization": None}}
    out = ShardedOutput(str(tmp_path), written, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    out.close()
    for faster in ({"max_num_seqs": 64, "quantization": None}, {"quantization": None, "enable_prefix_caching": False}):
        again = ShardedOutput(str(tmp_path), {**IDENTITY, "generator.engine_kwargs": faster}, ["rag"], shard_rows=3)
        assert again.committed == {("rag", 0)}  # its part kept, not answered again
    with pytest.raises(ConfigError, match="differs in: generator.engine_kwargs"):
        ShardedOutput(str(tmp_path), {**IDENTITY, "generator.engine_kwargs": {"max_num_seqs": 8, "quantization": "fp8"}},
                      ["rag"], shard_rows=3)


def test_a_section_no_strategy_of_the_run_reads_nor_pool_it_asks_is_no_part_of_its_identity(tmp_path):
    """Before, the whole config was the identity: a rag run was refused its resume after raisf.k or
    judge.model changed in a shared config (calibrating RA-ISF meanwhile), and --force discarded its answers."""
    from jobs.identity import identity_defaults, run_identity
    from jobs.output import changed_fields
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)
    plan = plan_input(str(questions))

    def changed(strategies, **sections):
        before = run_identity(AnswerConfig(questions=str(questions), strategies=strategies), plan)
        after = run_identity(AnswerConfig(questions=str(questions), strategies=strategies, **sections), plan)
        return changed_fields(before, after, identity_defaults())

    assert changed(["rag"], raisf={"k": 7}, judge={"model": "other"}, nli={"model": "nli"}, migres={"max_iterations": 5},
                   label={"collect": ["relevance"]}) == []
    assert changed(["raisf_labels"], label={"collect": ["relevance"]}) == ["label.collect"]  # what it asks
    assert changed(["rag"], retrieval={"k": 7}) == ["retrieval.k"]
    assert changed(["raisf"], raisf={"k": 7}) == ["raisf.k"]
    assert changed(["migres"], nli={"model": "nli"}) == ["nli.model"]  # MIGRES reads it: entailment by NLI
    assert "judge.model" in changed(["think_act"], judge={"model": "other"})  # its capability check's pool
    # an output that recorded them still resumes: a field left out is not compared
    old = run_identity(AnswerConfig(questions=str(questions), strategies=["rag"]), plan) | {"raisf.k": 9}
    assert changed_fields(old, run_identity(AnswerConfig(questions=str(questions), strategies=["rag"]), plan),
                          identity_defaults()) == []


def test_an_output_that_recorded_a_section_its_run_does_not_read_resumes_and_a_narrower_resume_keeps_its_record(
        tmp_path):
    """An output written before unread sections left the identity recorded judge.model for a rag run: its
    resume was refused (judge.model is no default's key). And a rag run resumed in an output of rag and raisf
    wrote a manifest without raisf.*, so a later raisf run with another raisf.k passed the check and had the
    raisf parts answered again instead of being refused."""
    from jobs.identity import identity_defaults, operational, run_identity
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)
    plan = plan_input(str(questions))

    def identity(strategies, **sections):
        return run_identity(AnswerConfig(questions=str(questions), strategies=strategies, **sections), plan)

    def output(folder, strategies, record=None, **sections):
        return ShardedOutput(str(tmp_path / folder), record or identity(strategies, **sections), strategies, 10,
                             defaults=identity_defaults(), speed=operational)

    judge = {"judge": {"model": "smollm2-135m-instruct"}}
    old = {**identity(["rag"]), "judge.model": "smollm2-135m-instruct", "judge.dtype": "auto"}  # as recorded before
    commit_one(output("old", ["direct"], old))
    assert output("old", ["direct"], **judge).committed == {("direct", 0)}

    both = output("both", ["direct", "raisf"], raisf={"k": 7})
    commit_one(both)
    output("both", ["direct"], raisf={"k": 7}).close()  # resumed for direct alone
    with pytest.raises(ConfigError, match="differs in: raisf.k"):
        output("both", ["raisf"])
    assert output("both", ["raisf"], raisf={"k": 7}).committed == set()  # the same settings: it resumes


def test_retry_errors_reads_only_ids_and_errors_and_opens_a_part_only_when_its_answers_come(tmp_path, monkeypatch):
    """A run of 1,000 parts with errors read each whole (traces too) and held a writer open for every one:
    past 1,024 open files before Ray started."""
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=2)
    for shard in range(3):
        out.sealed(shard, 2)
        out.write({**row(f"q{2 * shard}", "rag", shard), "trace": "x" * 100})
        out.write({**row(f"q{2 * shard + 1}", "rag", shard), "error": "boom"})
    assert out.close() == []
    read = []
    whole = output_module.pq.read_table
    monkeypatch.setattr(output_module.pq, "read_table", lambda f, columns=None: read.append(columns) or whole(f, columns=columns))
    again = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=2)
    assert again.reopen_errors() == 3 and read == [["id", "error"]] * 3 and again.open == {}
    for shard in range(3):
        again.sealed(shard, 2)
    again.write({**row("q3", "rag", 1), "answer": "healed"})  # only its part is opened, and commits whole
    assert again.open == {} and ("rag", 1) in again.committed and ("rag", 0) not in again.committed
    part = pq.read_table(tmp_path / "rag" / "part-00001.parquet")
    assert part["id"].to_pylist() == ["q2", "q3"] and part["answer"].to_pylist() == ["a", "healed"]
    assert part["trace"].to_pylist()[0] == "x" * 100
    assert pq.read_table(tmp_path / "rag" / "part-00000.parquet")["error"].to_pylist() == [None, "boom"]  # untouched
