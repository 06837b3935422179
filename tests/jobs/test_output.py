import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import output as output_module
from jobs.output import ShardedOutput
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


def test_a_different_run_is_refused_unless_forced(tmp_path):
    out = ShardedOutput(str(tmp_path), IDENTITY, ["rag"], shard_rows=3)
    out.sealed(0, 1)
    out.write(row("q0", "rag", 0))
    changed = {**IDENTITY, "generator.model": "other"}
    with pytest.raises(ConfigError, match="differs in: generator.model"):
        ShardedOutput(str(tmp_path), changed, ["rag"], shard_rows=3)
    (tmp_path / "_input").mkdir()  # this run's questions, converted (hf:, a datasets folder...) before the output opens
    (tmp_path / "_input" / "questions.parquet").write_bytes(b"converted")
    forced = ShardedOutput(str(tmp_path), changed, ["rag"], shard_rows=3, force=True, log=lambda *_: None)
    assert forced.committed == set() and not list((tmp_path / "rag").iterdir())
    assert (tmp_path / "_input" / "questions.parquet").read_bytes() == b"converted"


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
    assert out.verify(plan, str(q), 2, 100)["rag"] == {"rows": 3, "expected": 3, "duplicated": 0, "missing": 0, "ok": True}
    bad = ShardedOutput(str(tmp_path / "bad"), IDENTITY, ["rag"], shard_rows=10)
    bad.sealed(0, 3)
    for qid in ["a", "b", "b"]:
        bad.write(row(qid, "rag", 0))
    assert bad.verify(plan, str(q), 2, 100)["rag"] == {"rows": 3, "expected": 3, "duplicated": 1, "missing": 1, "ok": False}
