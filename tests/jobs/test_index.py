"""Index build (flat, IVF, HNSW, BM25), resume, and sharded search on a slice of the sample corpus."""

import hashlib
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from actors.bm25 import BM25Shard
from actors.encoder import Encoder
from actors.retriever import ShardRetriever, fuse_rrf, merge_topk
from jobs.index import IndexJobConfig, build_index, factory_string
from jobs.models import resolve
from schemas.config import IndexConfig, load_config
from schemas.errors import UserError
from tests.conftest import SAMPLE_CORPUS, SAMPLE_QUESTIONS

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


class HashEncoder:
    """Deterministic pseudo-embeddings (tests of index mechanics only); ``fail_after`` breaks it."""

    def __init__(self, fail_after: int | None = None):
        self.calls, self.fail_after = 0, fail_after

    def dims(self):
        return 32

    def n_calls(self):
        return self.calls

    def longer_than_read(self, texts):  # a pretend limit of 8 words
        return [len(t.split()) > 8 for t in texts]

    def encode(self, texts, role=None):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("encoder died")
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little") for t in texts]
        vectors = np.stack([np.random.default_rng(seed).standard_normal(32) for seed in seeds])
        return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def squad_slice(tmp_path_factory):
    """300 real passages that include the gold passages of the sample's SQuAD questions."""
    questions = pq.read_table(SAMPLE_QUESTIONS)
    squad = questions.filter(pc.equal(questions["dataset"], "squad")).to_pylist()
    gold = {g for q in squad for g in q["gold_passage_ids"]}
    corpus = pq.read_table(SAMPLE_CORPUS)
    is_gold = pc.is_in(corpus["id"], pa.array(sorted(gold)))
    table = pa.concat_tables([corpus.filter(is_gold), corpus.filter(pc.invert(is_gold)).slice(0, 300 - len(gold))])
    path = tmp_path_factory.mktemp("corpus") / "corpus.parquet"
    pq.write_table(table, path)
    return path, squad


def _config(corpus, out, shards, *overrides):
    return load_config(IndexJobConfig, None, [f"index.path={out}", f"index.shards={shards}",
                                              "index.encode_batch_rows=64", *overrides], corpus=str(corpus))


def _build(corpus, out, shards, *overrides, encoders=None, log=None):
    return build_index(_config(corpus, out, shards, *overrides), log=log or (lambda *a, **k: None), encoders=encoders)


@pytest.fixture(scope="module")
def real_indexes(ray_session, squad_slice, tmp_path_factory):
    corpus, _ = squad_slice
    root = tmp_path_factory.mktemp("idx")
    return root, _build(corpus, root / "one", 1), _build(corpus, root / "three", 3)


@pytest.mark.model
def test_sharded_search_equals_one_index(real_indexes, squad_slice):
    root, one, three = real_indexes
    _, squad = squad_slice
    assert one["count"] == three["count"] == 300
    assert [s["count"] for s in three["shards"]] == [100, 100, 100]
    assert json.loads((root / "three" / "manifest.json").read_text())["dims"] == 384

    queries = Encoder(resolve("all-minilm-l6-v2")).encode([q["question"] for q in squad])
    single = ShardRetriever(str(root / "one" / "shard-000")).search(queries, 10)
    shards = [ShardRetriever(str(root / "three" / s["dir"])) for s in three["shards"]]
    merged = merge_topk([s.search(queries, 10) for s in shards], 10)
    for a, b in zip(single, merged):
        assert [p.id for p in a] == [p.id for p in b]
        np.testing.assert_allclose([p.score for p in a], [p.score for p in b], rtol=1e-5)

    # the SQuAD questions are easy for dense retrieval over 300 passages
    hits = [bool(set(q["gold_passage_ids"]) & {p.id for p in res[:5]}) for q, res in zip(squad, merged)]
    assert sum(hits) / len(hits) >= 0.8


@pytest.mark.model
def test_bm25_and_hybrid_find_gold_passages(real_indexes, squad_slice):
    root, _, three = real_indexes
    _, squad = squad_slice
    assert three["bm25"]["k1"] == 0.9 and three["bm25"]["b"] == 0.4
    texts = [q["question"] for q in squad]
    bm25 = merge_topk([BM25Shard(str(root / "three" / s["dir"])).search(texts, 20) for s in three["shards"]], 20)
    vectors = Encoder(resolve("all-minilm-l6-v2")).encode(texts)
    dense = merge_topk([ShardRetriever(str(root / "three" / s["dir"])).search(vectors, 20) for s in three["shards"]], 20)
    hybrid = [fuse_rrf([d, b], [1.0, 1.0], 5) for d, b in zip(dense, bm25)]

    def recall_at_5(results):
        return np.mean([bool(set(q["gold_passage_ids"]) & {p.id for p in r[:5]}) for q, r in zip(squad, results)])

    assert recall_at_5(bm25) >= 0.8
    assert recall_at_5(hybrid) >= 0.8
    assert all(len(r) == 5 for r in hybrid)


def test_flat_ivf_and_hnsw_shards_agree(ray_session, squad_slice, tmp_path):
    import ray

    corpus, _ = squad_slice
    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    builds = {t: _build(corpus, tmp_path / t, 2, f"index.index_type={t}", "index.bm25=false", encoders=encoder)
              for t in ("flat", "ivf_flat", "hnsw")}
    assert [s["factory"] for s in builds["ivf_flat"]["shards"]] == ["IVF48,Flat"] * 2  # int(4*sqrt(150)) lists
    assert builds["hnsw"]["shards"][0]["factory"] == "HNSW32,Flat"
    queries = HashEncoder().encode([f"query {i}" for i in range(20)])

    def search(kind, **kw):
        return merge_topk([ShardRetriever(str(tmp_path / kind / s["dir"]), **kw).search(queries, 10)
                           for s in builds[kind]["shards"]], 10)

    flat = search("flat")
    assert [[p.id for p in r] for r in search("ivf_flat", nprobe=48)] == [[p.id for p in r] for r in flat]
    overlap = np.mean([len({p.id for p in a} & {p.id for p in b}) / 10 for a, b in zip(flat, search("hnsw"))])
    assert overlap >= 0.9


def test_ivf_pq_on_too_small_a_shard_is_a_clear_error(ray_session, squad_slice, tmp_path):
    import ray

    corpus, _ = squad_slice
    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    with pytest.raises(UserError, match=r"ivf_pq needs at least 2\*\*pq_bits=256 passages per shard"):
        _build(corpus, tmp_path / "pq", 2, "index.index_type=ivf_pq", "index.pq_m=8", encoders=encoder)


def test_settings_that_cannot_build_a_shard_leave_the_index_in_place_untouched_and_encode_nothing(
        ray_session, squad_slice, tmp_path):
    """pq_m=7 (not dividing the dims) was refused after every row was encoded, the old manifest removed
    and the shards wiped down to their spill files."""
    import ray

    corpus, _ = squad_slice
    encoder = ray.remote(HashEncoder).options(num_cpus=0).remote()
    _build(corpus, tmp_path / "idx", 2, encoders=[encoder])
    before = {p.relative_to(tmp_path): p.stat().st_mtime_ns for p in (tmp_path / "idx").rglob("*")}
    calls = ray.get(encoder.n_calls.remote())
    for bad in ("index.pq_m=7", "index.pq_m=8"):  # 7 does not divide the dims; 8 on shards too small to train
        with pytest.raises(UserError, match="pq_m=7 must divide|ivf_pq needs at least"):
            _build(corpus, tmp_path / "idx", 2, "index.index_type=ivf_pq", bad, encoders=[encoder])
    assert {p.relative_to(tmp_path): p.stat().st_mtime_ns for p in (tmp_path / "idx").rglob("*")} == before
    assert ray.get(encoder.n_calls.remote()) == calls


def test_a_corpus_with_no_usable_row_is_a_clear_error_not_an_empty_index_and_the_index_in_place_stays(
        ray_session, squad_slice, tmp_path):
    """It was refused after the index in the folder was gone (its manifest removed, its shard wiped)."""
    import ray

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(squad_slice[0], tmp_path / "idx", 1, encoders=encoder)
    before = {p.relative_to(tmp_path): p.stat().st_mtime_ns for p in (tmp_path / "idx").rglob("*")}
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": pa.array([None, " "], pa.string())}), corpus)
    with pytest.raises(UserError, match=r"no row of its 2 can be indexed"):
        _build(corpus, tmp_path / "idx", 1, encoders=encoder)
    assert {p.relative_to(tmp_path): p.stat().st_mtime_ns for p in (tmp_path / "idx").rglob("*")} == before


def test_shards_too_small_once_their_unusable_rows_are_left_out_are_refused_before_the_index_in_place_is_touched(
        ray_session, squad_slice, tmp_path):
    """300 rows, 50 of them repeating an id: ivf_pq's 256-passage check counted the 300, removed the manifest
    and wiped the shard, and refused only when the shard it built had 250."""
    import ray

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(squad_slice[0], tmp_path / "idx", 1, encoders=encoder)
    before = {p.relative_to(tmp_path): p.stat().st_mtime_ns for p in (tmp_path / "idx").rglob("*")}
    table = pq.read_table(squad_slice[0])
    ids = table["id"].to_pylist()
    repeated = table.set_column(table.schema.get_field_index("id"), "id", pa.array(ids[:250] + ids[:50]))
    pq.write_table(repeated, tmp_path / "dup.parquet")
    calls = ray.get(encoder[0].n_calls.remote())
    with pytest.raises(UserError, match=r"ivf_pq needs at least 2\*\*pq_bits=256 passages per shard .*a shard has 250"):
        _build(tmp_path / "dup.parquet", tmp_path / "idx", 1, "index.index_type=ivf_pq", "index.pq_m=8", encoders=encoder)
    assert {p.relative_to(tmp_path): p.stat().st_mtime_ns for p in (tmp_path / "idx").rglob("*")} == before
    assert ray.get(encoder[0].n_calls.remote()) == calls


def test_the_same_corpus_named_by_another_path_resumes_every_shard(ray_session, squad_slice, tmp_path, monkeypatch):
    """``./c.parquet``, an absolute path, or the file named from another folder rebuilt the whole index (the
    key held the path as typed), offline meanwhile."""
    import ray

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    shutil.copy(squad_slice[0], tmp_path / "c.parquet")
    monkeypatch.chdir(tmp_path)
    built = _build("c.parquet", tmp_path / "idx", 2, encoders=encoder)
    assert built["corpus"] == str(tmp_path / "c.parquet")
    calls = ray.get(encoder[0].n_calls.remote())
    for spelling in ("./c.parquet", str(tmp_path / "c.parquet"), f"{tmp_path}/../{tmp_path.name}/c.parquet"):
        lines = []
        _build(spelling, tmp_path / "idx", 2, encoders=encoder, log=lines.append)
        assert lines == [f"{tmp_path / 'idx'} is up to date: 2 shards built from this corpus with these settings"]
    assert ray.get(encoder[0].n_calls.remote()) == calls


def test_shards_committed_under_the_key_that_held_the_corpus_path_are_kept(ray_session, squad_slice, tmp_path):
    """An index built before the path left the key resumes (the same spelling), not rebuilt from nothing."""
    import ray

    from jobs import index

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(squad_slice[0], tmp_path / "idx", 1, encoders=encoder)
    done = tmp_path / "idx" / "shard-000" / "done.json"
    info = json.loads(done.read_text())
    config = _config(squad_slice[0], tmp_path / "idx", 1)
    info["build_key"] = index._build_key(config, 300, [0, 300], json.loads(
        (tmp_path / "idx" / "manifest.json").read_text())["corpus_sha256"], str(squad_slice[0]))
    done.write_text(json.dumps(info))
    lines = []
    _build(squad_slice[0], tmp_path / "idx", 1, encoders=encoder, log=lines.append)
    assert "resuming: 1 of 1 shards already built" in lines  # the manifest lists the shard's old key: written again
    lines.clear()
    _build(squad_slice[0], tmp_path / "idx", 1, encoders=encoder, log=lines.append)
    assert lines[-1].endswith("is up to date: 1 shards built from this corpus with these settings")


def test_a_rerun_over_an_index_up_to_date_starts_nothing_and_keeps_its_manifest(ray_session, squad_slice, tmp_path,
                                                                                 monkeypatch):
    """It started Ray and the encoders and wrote the manifest again, its build_s now the rerun's 0.02 s."""
    import ray

    import jobs.ray_session

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    built = _build(squad_slice[0], tmp_path / "idx", 2, encoders=encoder)
    written = (tmp_path / "idx" / "manifest.json").stat().st_mtime_ns
    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *args: pytest.fail("Ray started for nothing to build"))
    assert _build(squad_slice[0], tmp_path / "idx", 2, encoders=encoder) == built
    assert (tmp_path / "idx" / "manifest.json").stat().st_mtime_ns == written
    lines = []  # other settings: built again (each shard's key holds them)
    monkeypatch.undo()
    _build(squad_slice[0], tmp_path / "idx", 2, "index.bm25=false", encoders=encoder, log=lines.append)
    assert not any("up to date" in line for line in lines) and (tmp_path / "idx" / "manifest.json").stat().st_mtime_ns != written


def test_interrupted_build_redoes_only_the_unfinished_shard(ray_session, squad_slice, tmp_path):
    import ray

    corpus, _ = squad_slice
    out = tmp_path / "idx"
    # 300 rows in batches of 64, 3 shards of 100: the 3rd encode call breaks inside shard 1
    breaking = [ray.remote(HashEncoder).options(num_cpus=0).remote(fail_after=2)]
    with pytest.raises(ray.exceptions.RayTaskError, match="encoder died"):
        _build(corpus, out, 3, encoders=breaking)
    assert (out / "shard-000" / "done.json").exists() and not (out / "shard-001" / "done.json").exists()
    first = (out / "shard-000" / "index.faiss").stat().st_mtime_ns

    lines = []
    fresh = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    resumed = _build(corpus, out, 3, encoders=fresh, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert "resuming: 1 of 3 shards already built" in lines
    assert (out / "shard-000" / "index.faiss").stat().st_mtime_ns == first
    assert not any((out / s["dir"] / "vectors.npy").exists() for s in resumed["shards"])

    clean = _build(corpus, tmp_path / "clean", 3, encoders=fresh)
    assert [s["index_sha256"] for s in resumed["shards"]] == [s["index_sha256"] for s in clean["shards"]]
    assert resumed["count"] == clean["count"] == 300


def test_an_index_rebuilt_from_a_copy_of_its_corpus_keeps_its_identity_and_other_passages_change_it(
        ray_session, squad_slice, tmp_path):
    """A long run resumes against the same index rebuilt on a new machine (the corpus elsewhere, its
    vectors' last bits from another CPU), never against one holding other passages or built otherwise."""
    import shutil

    import ray

    from jobs.index import manifest_sha256

    corpus, _ = squad_slice
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(corpus, tmp_path / "first", 2, encoders=encoders)
    copy = tmp_path / "elsewhere" / "corpus.parquet"
    copy.parent.mkdir()
    shutil.copy(corpus, copy)
    _build(copy, tmp_path / "rebuilt", 2, encoders=encoders)
    manifest = json.loads((tmp_path / "rebuilt" / "manifest.json").read_text())
    manifest["shards"][0]["index_sha256"] = "0" * 64  # vectors equal but for their last bits
    (tmp_path / "rebuilt" / "manifest.json").write_text(json.dumps(manifest))
    assert manifest_sha256(tmp_path / "rebuilt") == manifest_sha256(tmp_path / "first")

    edited = pq.read_table(corpus).to_pylist()
    edited[0]["text"] += " (edited)"
    pq.write_table(pa.Table.from_pylist(edited), tmp_path / "edited.parquet")
    _build(tmp_path / "edited.parquet", tmp_path / "other_passages", 2, encoders=encoders)
    _build(corpus, tmp_path / "hnsw", 2, "index.index_type=hnsw", encoders=encoders)
    assert len({manifest_sha256(tmp_path / d) for d in ("first", "other_passages", "hnsw")}) == 3


def test_encoder_replicas_take_the_batches_in_turn(ray_session, squad_slice, tmp_path):
    import ray

    corpus, _ = squad_slice
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote() for _ in range(2)]
    _build(corpus, tmp_path / "idx", 1, "index.encode_batch_rows=16", encoders=encoders)  # 19 batches
    # before: once 2 x replicas batches were queued, every further batch went to the first replica (17 / 2)
    assert ray.get([e.n_calls.remote() for e in encoders]) == [10, 9]


def test_a_corpus_rewritten_in_place_with_as_many_rows_is_indexed_again_and_a_rebuild_hides_the_old_manifest(
        ray_session, squad_slice, tmp_path):
    import ray

    corpus, _ = squad_slice
    mine, out = tmp_path / "corpus.parquet", tmp_path / "idx"
    rows = pq.read_table(corpus).to_pylist()
    pq.write_table(pa.Table.from_pylist(rows), mine)
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    first = _build(mine, out, 2, encoders=encoders)
    rows[0]["text"] += " (corrected)"
    pq.write_table(pa.Table.from_pylist(rows), mine)
    lines = []
    second = _build(mine, out, 2, encoders=encoders, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert not any("resuming" in line for line in lines)
    assert second["shards"][0]["passages_sha256"] != first["shards"][0]["passages_sha256"]
    assert second["shards"][1] == first["shards"][1] | {"build_key": second["shards"][1]["build_key"]}
    # a rebuild that fails leaves no manifest naming shards it was replacing
    with pytest.raises(ray.exceptions.RayTaskError, match="encoder died"):
        _build(mine, out, 2, "index.index_type=hnsw", encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote(fail_after=1)])
    assert not (out / "manifest.json").exists()


class DyingOnceEncoder(HashEncoder):
    """Its process exits on its 2nd encode call, once per ``marker`` file (as an OOM kill would)."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def encode(self, texts, role=None):
        import os

        if self.calls == 1 and not os.path.exists(self.marker):  # HashEncoder counts the calls
            open(self.marker, "w").close()
            os._exit(1)
        return super().encode(texts)


def test_an_encoder_that_dies_mid_build_is_restarted_and_its_batch_encoded_again(ray_session, squad_slice, tmp_path):
    import ray

    from jobs.index import encoder_options
    from schemas.config import EmbedderConfig

    corpus, _ = squad_slice
    options = {**encoder_options(EmbedderConfig()), "num_cpus": 0}
    dying = [ray.remote(DyingOnceEncoder).options(**options).remote(str(tmp_path / "died"))]
    manifest = _build(corpus, tmp_path / "idx", 3, encoders=dying)
    assert (tmp_path / "died").exists()  # it did die, inside shard 0's rows
    clean = _build(corpus, tmp_path / "clean", 3, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert [s["index_sha256"] for s in manifest["shards"]] == [s["index_sha256"] for s in clean["shards"]]
    assert manifest["count"] == clean["count"] == 300


@pytest.mark.model
def test_the_embedder_says_which_texts_are_longer_than_it_reads():
    encoder = Encoder(resolve("all-minilm-l6-v2"))  # max_seq_length 256 word pieces
    assert encoder.longer_than_read(["Paris is the capital of France.", "word " * 250, "word " * 260]) == [
        False, False, True]  # 250 words and the two special tokens fit; 260 do not
    long = "The city grew. " * 100
    assert np.allclose(encoder.encode([long])[0], encoder.encode([long + "Nobody reads this far."])[0])


def test_passages_longer_than_the_embedder_reads_are_counted_per_shard_and_warned_of(ray_session, tmp_path):
    """Before, whole articles were indexed in silence, embedded by their first 256 word pieces."""
    import ray

    corpus = tmp_path / "c.parquet"
    texts = ["short one", "a passage of far more than eight words to read here", "short two",
             "another passage of far more than eight words to read"]
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(4)], "text": texts}), corpus)
    said = []
    manifest = _build(corpus, tmp_path / "idx", 2, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()],
                      log=said.append)
    assert manifest["cut_by_embedder"] == 2 and [s["cut_by_embedder"] for s in manifest["shards"]] == [1, 1]
    assert said[-1].startswith("warning: 2 of 4 passages are longer than all-minilm-l6-v2 reads")
    (tmp_path / "idx" / "manifest.json").unlink()  # a build resumed over both shards: their counts are kept
    again = _build(corpus, tmp_path / "idx", 2, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert again["cut_by_embedder"] == 2
    done = tmp_path / "idx" / "shard-001" / "done.json"  # a shard built before the count: the total is unknown
    done.write_text(json.dumps({k: v for k, v in json.loads(done.read_text()).items() if k != "cut_by_embedder"}))
    (tmp_path / "idx" / "manifest.json").unlink()
    assert _build(corpus, tmp_path / "idx", 2, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])[
        "cut_by_embedder"] is None


def test_a_shard_restarted_after_its_index_was_rebuilt_in_place_refuses_to_serve_the_new_one(ray_session, tmp_path):
    """Before, Ray restarted a killed shard actor from its folder, and a run whose index had been rebuilt
    meanwhile answered its later questions from the other corpus, in silence, exit 0."""
    import ray

    from jobs.index import read_manifest
    from jobs.pools import _shards
    from strategies.registry import AnswerConfig

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["alpha text", "beta text"]}), corpus)
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(corpus, tmp_path / "idx", 1, encoders=encoders)
    config = AnswerConfig.model_validate({"index": {"path": str(tmp_path / "idx")}})
    (args,) = _shards(config, read_manifest(tmp_path / "idx")).replicas  # what the run's shard actor starts from
    assert ShardRetriever(*args).size() == 2
    done = tmp_path / "idx" / "shard-000" / "done.json"  # the same passages rebuilt on another CPU: other vector bytes
    done.write_text(json.dumps({**json.loads(done.read_text()), "index_sha256": "0" * 64}))
    assert ShardRetriever(*args).size() == 2
    pq.write_table(pa.table({"id": ["x", "y", "z"], "text": ["other", "corpus", "here"]}), corpus)
    _build(corpus, tmp_path / "idx", 1, encoders=encoders)  # a colleague rebuilds it in place
    with pytest.raises(RuntimeError, match=r"in place \(other passages, embedder or settings\): is not the shard") as refused:
        ShardRetriever(*args)
    # the stage stops saying so, not "rerun the same command to resume" (the rerun is refused: another index)
    from engine.stages import GeneratorStage
    from schemas.config import StageBatching
    from schemas.errors import StageDown

    with pytest.raises(StageDown) as down:
        GeneratorStage([object()], StageBatching()).retire(0, refused.value)
    assert "a resume cannot follow" in str(down.value) and "rerun the same command" not in str(down.value)
    shutil.rmtree(tmp_path / "idx" / "shard-000")  # being rebuilt: no done.json yet
    with pytest.raises(RuntimeError, match="is not the shard this run started with"):
        ShardRetriever(*args)


def test_an_index_folder_a_build_holds_is_said_to_be_building_not_missing(tmp_path):
    """Before, an answer started during a build was told to "run `ragsift index` first": a second build."""
    from jobs.index import read_manifest

    (tmp_path / "idx").mkdir()
    with pytest.raises(FileNotFoundError, match=r"run `ragsift index` first"):
        read_manifest(tmp_path / "idx")
    (tmp_path / "idx" / "_lease.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"a `ragsift index` build holds it \(_lease.json\)"):
        read_manifest(tmp_path / "idx")


def test_bad_corpus_rows_are_skipped_and_counted(ray_session, tmp_path):
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "a", None, "c", " "], "title": ["A", None, "A2", "N", "C", "E"],
                             "text": ["alpha text", "beta text", "dup", "no id", None, "empty id"]}), corpus)
    manifest = _build(corpus, tmp_path / "idx", 2, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["count"] == 2  # an empty id is none, as a CSV's empty cell is (it was indexed as " ")
    assert manifest["skipped"] == {"null_text": 1, "null_id": 2, "duplicate_id": 1, "invalid_utf8": 0}
    ids = [r for s in manifest["shards"] for r in
           pq.read_table(tmp_path / "idx" / s["dir"] / "passages.parquet")["id"].to_pylist()]
    assert ids == ["a", "b"]
    assert [s["count"] for s in manifest["shards"]] == [2, 0]
    assert BM25Shard(str(tmp_path / "idx" / "shard-000")).search(["alpha"], 3)[0][0].id == "a"
    assert BM25Shard(str(tmp_path / "idx" / "shard-001")).search(["alpha"], 3) == [[]]  # empty shard


@pytest.mark.parametrize("table, message", [
    (pa.table({"id": ["a"], "body": ["x"]}), r"c\.parquet.*'text'"),
    (pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), "the corpus has no rows"),
])
def test_unusable_corpus_is_a_clear_error(tmp_path, table, message):
    corpus = tmp_path / "c.parquet"
    pq.write_table(table, corpus)
    with pytest.raises(UserError, match=message):
        build_index(_config(corpus, tmp_path / "i", 1))


def test_the_index_job_encodes_on_every_core_of_its_machine_unless_told_otherwise():
    """OMP_NUM_THREADS=1 (right beside vLLM) left the index job encoding on one core of two: 120 s
    instead of 68 s for the demo corpus (BENCHMARKS.md)."""
    import torch

    from jobs.index import encoder_threads
    from schemas.config import EmbedderConfig

    assert encoder_threads(EmbedderConfig(), cores=8) == 8
    assert encoder_threads(EmbedderConfig(replicas=3), cores=8) == 2
    assert encoder_threads(EmbedderConfig(replicas=4), cores=2) == 1
    assert encoder_threads(EmbedderConfig(threads=3, replicas=2), cores=8) == 3
    before = torch.get_num_threads()
    try:
        Encoder(resolve("all-minilm-l6-v2"), threads=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_an_embedder_retrained_in_the_same_place_rebuilds_the_shards_it_encoded(ray_session, squad_slice, tmp_path):
    import ray

    from jobs.index import _local_weights_sha256

    corpus, _ = squad_slice
    model, out, pooling = tmp_path / "m_embed", tmp_path / "idx", tmp_path / "pooling"
    (model / ".cache").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights of the first training")
    pooling.mkdir()
    (pooling / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (model / "1_Pooling").symlink_to(pooling)  # a folder shared by link
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]

    def build():
        lines = []
        manifest = _build(corpus, out, 2, f"embedder.model={model}", encoders=encoders,
                          log=lambda *a, **k: lines.append(" ".join(map(str, a))))
        return manifest["shards"][0]["build_key"], any("resuming" in line or "up to date" in line for line in lines)

    first, _ = build()
    (model / ".cache" / "download.lock").write_bytes(b"a hub client's bookkeeping")
    assert build() == (first, True)
    (model / "model.safetensors").write_bytes(b"weights of the second training")
    retrained, resumed = build()
    assert retrained != first and not resumed
    (pooling / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert build()[0] != retrained
    # an offline alias or a hub name is named by its name: indexes built with one keep their build key
    assert _local_weights_sha256("all-minilm-l6-v2") is None
    assert _local_weights_sha256("sentence-transformers/all-MiniLM-L6-v2") is None


def test_a_shard_whose_passages_hold_no_word_builds_and_its_bm25_finds_nothing(ray_session, tmp_path):
    """bm25s raised on an empty vocabulary: the whole index failed, at the same shard on every rerun."""
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(6)],
                             "text": ["alpha beta", "gamma delta", "epsilon", "the and of", "!!! ???", "a an x"]}), corpus)
    manifest = _build(corpus, tmp_path / "idx", 2, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["count"] == 6
    assert BM25Shard(str(tmp_path / "idx" / "shard-001")).search(["the of", "alpha"], 3) == [[], []]
    assert BM25Shard(str(tmp_path / "idx" / "shard-000")).search(["alpha"], 3)[0][0].id == "p0"
    shutil.rmtree(tmp_path / "idx" / "shard-000" / "bm25")  # a shard copied without its BM25 still fails loudly
    with pytest.raises(FileNotFoundError, match="shard-000/bm25/"):  # naming what is missing
        BM25Shard(str(tmp_path / "idx" / "shard-000"))


def test_bm25_finds_chinese_and_japanese_passages_by_their_characters_and_english_as_before(ray_session, tmp_path):
    """Before, a clause of Chinese or Japanese (no spaces) was one token that no question repeats: BM25, and MIGRES
    that reads with it, found nothing for such questions."""
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["zh", "ja", "en", "ko"],
                             "text": ["明长城全长八千八百五十公里，是世界上最长的城墙。",
                                      "東京タワーは東京都港区にある電波塔です。",
                                      "The Great Wall of China is the longest wall in the world.",
                                      "서울은 대한민국의 수도이다."]}), corpus)
    _build(corpus, tmp_path / "idx", 1, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    shard = BM25Shard(str(tmp_path / "idx" / "shard-000"))
    found = shard.search(["明长城全长多少公里？", "東京タワーはどこにありますか", "How long is the Great Wall?",
                          "서울은 어디의 수도인가"], 1)
    assert [hits[0].id for hits in found] == ["zh", "ja", "en", "ko"]
    from actors.bm25 import tokenize

    # iteration marks and characters past the basic plane are characters too; the middle dot is punctuation
    assert tokenize(["時々𠮷野家・ｶﾀ"], return_ids=False) == [["時", "々", "𠮷", "野", "家", "ｶ", "ﾀ"]]


def test_ivf_lists_are_capped_at_the_training_sample(ray_session, tmp_path):
    """FAISS needs a training point per list: nlist 1,200 over a 1,000-vector sample failed after encoding."""
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(1500)], "text": [f"passage {i}" for i in range(1500)]}), corpus)
    manifest = _build(corpus, tmp_path / "idx", 1, "index.index_type=ivf_flat", "index.nlist=1200",
                      "index.train_sample=1000", encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["shards"][0]["factory"] == "IVF1000,Flat"
    with pytest.raises(UserError, match="train_sample is 1000"):
        factory_string(IndexConfig(index_type="ivf_pq", pq_m=8, pq_bits=11, train_sample=1000), 32, 2100)


def test_an_ivf_pq_refusal_names_only_fixes_that_can_work():
    """Before, a one-shard corpus of 40 passages was told "use fewer shards, a larger train_sample or flat":
    neither of the first two could work; a smaller pq_bits, which could, was not named."""
    with pytest.raises(UserError, match=r"use index.pq_bits of at most 5 or index_type flat$"):
        factory_string(IndexConfig(index_type="ivf_pq", pq_m=8, shards=1), 32, 40)
    with pytest.raises(UserError, match=r"\); use index_type flat$"):
        factory_string(IndexConfig(index_type="ivf_pq", pq_m=8, shards=1), 32, 1)
    with pytest.raises(UserError, match=r"use fewer shards, a larger index.train_sample, index.pq_bits of at most 9 or"):
        factory_string(IndexConfig(index_type="ivf_pq", pq_m=8, pq_bits=11, train_sample=1000), 32, 2100)


def test_a_shard_searched_without_a_config_probes_as_the_config_does(ray_session, tmp_path):
    """Pair mining and the retrieval benchmark searched IVF shards at FAISS's nprobe 1: 5 of 30 hits."""
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(400)], "text": [f"passage {i}" for i in range(400)]}), corpus)
    _build(corpus, tmp_path / "idx", 1, "index.index_type=ivf_flat", "index.nlist=80",
           encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    vectors = HashEncoder().encode(["passage 7", "passage 300"])
    assert [len(h) for h in ShardRetriever(str(tmp_path / "idx" / "shard-000")).search(vectors, 30)] == [30, 30]


def test_an_id_keeps_its_first_usable_row(ray_session, tmp_path):
    """The first row of an id had no text: it was skipped as null text and the id's real passage as a duplicate."""
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "a", "b"], "text": [None, "the real passage", "other"]}), corpus)
    manifest = _build(corpus, tmp_path / "idx", 1, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["count"] == 2 and manifest["skipped"]["null_text"] == 1 and manifest["skipped"]["duplicate_id"] == 0
    assert pq.read_table(tmp_path / "idx" / "shard-000" / "passages.parquet")["text"].to_pylist() == [
        "the real passage", "other"]


def test_a_local_ray_is_sized_for_every_encoder_replica_and_encoders_go_where_their_resources_say(tmp_path,
                                                                                                monkeypatch):
    """A third replica on a 2-CPU Ray was never placed and the build stalled; embedder.resources (the
    cluster configs' {retrieval: 1}) was dropped, so encoders landed on any node."""
    from jobs.index import encoder_options
    from schemas.config import EmbedderConfig

    asked = {}

    def sized(config, cpus=0.0, resources=None, gpus=()):
        asked.update(cpus=cpus, resources=resources, gpus=gpus)
        raise RuntimeError("stop before Ray starts")

    monkeypatch.setattr("jobs.ray_session.init_ray", sized)  # imported where build_index starts Ray
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["alpha"]}), corpus)
    with pytest.raises(RuntimeError, match="stop before Ray starts"):
        _build(corpus, tmp_path / "idx", 1, "embedder.replicas=3", "embedder.num_cpus=1",
               "embedder.resources={retrieval: 1}", "embedder.num_gpus=0.5")
    assert asked == {"cpus": 3, "resources": {"retrieval": 3}, "gpus": (0.5, 0.5, 0.5)}  # one a replica
    assert encoder_options(EmbedderConfig(resources={"retrieval": 1}))["resources"] == {"retrieval": 1}


def test_a_second_build_of_an_index_folder_being_built_is_refused_and_the_first_keeps_its_shards(tmp_path):
    """Two demos (or two `ragsift index`) on one folder: each removed the shard the other was writing, and
    both failed (a 4-byte passages.parquet, a vectors.npy gone)."""
    from jobs.lease import Lease, OutputInUse

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["some text"]}), corpus)
    (tmp_path / "idx" / "shard-000").mkdir(parents=True)
    (tmp_path / "idx" / "shard-000" / "vectors.npy").write_bytes(b"being written")
    with Lease(str(tmp_path / "idx"), heartbeat_s=0.05):  # the first build
        with pytest.raises(OutputInUse, match="use another --index-dir"):
            build_index(load_config(IndexJobConfig, corpus=str(corpus), overrides=[f"index.path={tmp_path / 'idx'}"]))
        assert (tmp_path / "idx" / "shard-000" / "vectors.npy").read_bytes() == b"being written"


def test_the_build_logs_whole_lines_of_progress_that_a_job_log_can_read(ray_session, squad_slice, tmp_path, monkeypatch):
    import ray

    import jobs.index

    monkeypatch.setattr(jobs.index, "PROGRESS_EVERY_S", 0.0)
    corpus, _ = squad_slice
    calls = []
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(corpus, tmp_path / "idx", 2, "index.encode_batch_rows=100", encoders=encoders,
           log=lambda *a, **k: calls.append((" ".join(map(str, a)), k)))
    # before: every batch's count ended in "\r", so a Ray job's log held one line of glued counts and shard lines
    assert all(k.get("end", "\n") == "\n" for _, k in calls)
    progress = [line for line, _ in calls if line.startswith("read ")]
    assert progress[-1].startswith("read 300/300 rows (100%)") and len(progress) == 3


def test_a_json_lines_corpus_that_cannot_be_read_leaves_no_half_copy_and_no_new_folder(tmp_path):
    """Its 0-byte ``_corpus.parquet.tmp`` stayed, so the folder made for the index was not removed either."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "body": "x"}\n')
    with pytest.raises(UserError, match="no column"):
        build_index(_config(corpus, tmp_path / "new", 1))
    assert not (tmp_path / "new").exists()


def test_a_rebuild_into_fewer_shards_removes_the_old_shards_past_them(ray_session, squad_slice, tmp_path):
    """4 shards, then 2: shard-002 and shard-003 stayed on disk (gigabytes on a large corpus) though nothing read them."""
    import ray

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(squad_slice[0], tmp_path / "idx", 4, encoders=encoder)
    (tmp_path / "idx" / "shard-notes").mkdir()  # not a shard of ours: left alone
    manifest = _build(squad_slice[0], tmp_path / "idx", 2, encoders=encoder)
    assert sorted(p.name for p in (tmp_path / "idx").glob("shard-*")) == ["shard-000", "shard-001", "shard-notes"]
    assert manifest["count"] == 300


def test_an_index_built_from_a_corpus_uri_with_credentials_keeps_none_in_its_manifest(
        ray_session, squad_slice, tmp_path, monkeypatch):
    """The manifest held `s3://KEY:SECRET@bucket/...` as given; an index folder is copied and shared."""
    from urllib.parse import urlsplit

    import pyarrow.fs as pafs
    import ray

    import jobs.index
    import jobs.storage

    store = pafs._MockFileSystem()  # an object store of this process, which mock:// URIs name
    with store.open_output_stream("c.parquet") as f:
        f.write(squad_slice[0].read_bytes())
    real = jobs.storage.filesystem
    stored = lambda uri: (store, urlsplit(uri).path.lstrip("/")) if uri.startswith("mock://") else real(uri)  # noqa: E731
    monkeypatch.setattr(jobs.storage, "filesystem", stored)
    monkeypatch.setattr(jobs.index, "filesystem", stored)
    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build("mock://KEY:SECRET@bucket/c.parquet", tmp_path / "idx", 1, encoders=encoder)
    manifest = (tmp_path / "idx" / "manifest.json").read_text()
    assert json.loads(manifest)["corpus"] == "mock://***@bucket/c.parquet" and "SECRET" not in manifest


def test_an_index_folder_is_no_uri_and_the_refusal_repeats_no_credentials():
    """`--index-dir s3://KEY:SECRET@b/idx` failed in a traceback that printed the secret (build) or said
    "no index at s3://KEY:SECRET@... run `ragsift index` first" (answer)."""
    from schemas.config import ConfigError

    with pytest.raises(ConfigError, match="index.path: .*not a URI") as refused:
        _config(SAMPLE_CORPUS, "s3://KEY:SECRET@b/idx?endpoint_override=x", 1)
    assert "SECRET" not in str(refused.value)


def test_ivf_pq_on_too_small_a_shard_is_refused_before_ray_or_the_embedder_starts(monkeypatch, tmp_path):
    """It was refused only once the encoder had loaded (~20 s on this box), and left an empty index folder."""
    import jobs.ray_session

    def started(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(jobs.ray_session, "init_ray", started)
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(40)], "text": [f"passage {i}" for i in range(40)]}), corpus)
    with pytest.raises(UserError, match=r"ivf_pq needs at least 2\*\*pq_bits=256 passages"):
        _build(corpus, tmp_path / "idx", 1, "index.index_type=ivf_pq", "index.pq_m=8", encoders=None)
    assert not (tmp_path / "idx").exists()


def test_a_shard_restarted_after_its_index_was_rebuilt_by_another_embedder_refuses_to_serve_it(ray_session, tmp_path):
    """The same passages embedded by another model of the same dimension: the passages' checksum alone let
    the restarted shard serve vectors the run's queries cannot be compared with."""
    import ray

    from jobs.index import read_manifest
    from jobs.pools import _shards
    from strategies.registry import AnswerConfig

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["alpha text", "beta text"]}), corpus)
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(corpus, tmp_path / "idx", 1, encoders=encoders)
    (args,) = _shards(AnswerConfig.model_validate({"index": {"path": str(tmp_path / "idx")}}),
                      read_manifest(tmp_path / "idx")).replicas
    _build(corpus, tmp_path / "idx", 1, encoders=encoders)  # the same build again: served
    assert ShardRetriever(*args).size() == 2
    # the same passages written again (other bytes: the build key changes, the run's identity does not): served
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["alpha text", "beta text"]}), corpus, compression="gzip")
    _build(corpus, tmp_path / "idx", 1, encoders=encoders)
    assert ShardRetriever(*args).size() == 2
    _build(corpus, tmp_path / "idx", 1, "embedder.model=another-384-d-model", encoders=encoders)
    assert read_manifest(tmp_path / "idx")["shards"][0]["passages_sha256"] == args[4]  # the same passages
    with pytest.raises(RuntimeError, match="is not the shard this run started with"):
        ShardRetriever(*args)


def test_chunk_words_splits_long_passages_into_parts_each_searchable_and_counted(ray_session, tmp_path):
    import ray

    from actors.bm25 import BM25Shard
    from jobs.identity import run_identity
    from jobs.index import index_chunks
    from jobs.questions import plan_input
    from strategies.registry import AnswerConfig

    long = " ".join(["filler"] * 150 + ["zebra", "quagga"] + ["filler"] * 28)  # 180 words: parts 0-99 and 90-179
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "title": ["Long", "Short"], "text": [long, "a short passage"]}), corpus)
    encoders = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    lines = []
    manifest = _build(corpus, tmp_path / "idx", 1, "index.chunk_words=100", "index.chunk_overlap=10",
                      encoders=encoders, log=lines.append)
    passages = pq.read_table(tmp_path / "idx" / "shard-000" / "passages.parquet").to_pylist()
    assert [p["id"] for p in passages] == ["a#0", "a#1", "b"] and manifest["count"] == 3
    assert [p["title"] for p in passages] == ["Long", "Long", "Short"] and passages[1]["text"].startswith("filler")
    assert len(passages[1]["text"].split()) == 90 and "zebra quagga" in passages[1]["text"]
    assert manifest["chunks"] == {"words": 100, "overlap": 10, "split": 1} == index_chunks(tmp_path / "idx")
    assert BM25Shard(str(tmp_path / "idx" / "shard-000")).search(["zebra"], 1)[0][0].id == "a#1"
    again = []
    _build(corpus, tmp_path / "idx", 1, "index.chunk_words=100", "index.chunk_overlap=10", encoders=encoders,
           log=again.append)
    assert "up to date" in again[0]
    # HashEncoder reads 8 words: parts of 100 are longer, and the warning says to split smaller, not to split
    assert any("split them smaller than --chunk-words 100" in line for line in lines)
    # a run on it says so in its identity (evaluate reads it from the answers' metadata)
    qs = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["q"], "question": ["which zebra?"]}), qs)
    config = AnswerConfig.model_validate({"index": {"path": str(tmp_path / "idx")}})
    assert run_identity(config, plan_input(str(qs)))["index.chunks"]["words"] == 100
    # an index of passages as they are: no chunk record, and the build key it had before chunking existed
    plain = _build(corpus, tmp_path / "plain", 1, encoders=encoders)
    assert "chunks" not in plain and [p for p in plain["shards"][0] if p == "split"] == []
    assert "index.chunks" not in run_identity(config.model_copy(update={"index": config.index.model_copy(
        update={"path": str(tmp_path / "plain")})}), plan_input(str(qs)))



@pytest.mark.model
def test_a_fact_late_in_a_long_article_is_found_by_dense_search_once_the_article_is_split(ray_session, tmp_path):
    """The real MiniLM reads the first 256 word pieces of a passage: a fact past them is invisible to dense
    search in the whole article, and found in its part once `index.chunk_words` splits it."""
    start = " ".join(pq.read_table(SAMPLE_CORPUS, columns=["text"])["text"].to_pylist()[:5])  # ~400 words of other topics
    article = start + " The Zorbian lighthouse was designed by the architect Elena Varga and first lit in 1887."
    others = ["The Brenton lighthouse was painted red in 1950.", "Lighthouses guide ships along rocky coasts at night.",
              "The Kessel lighthouse keeper kept a diary for forty years."]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["art", "o1", "o2", "o3"], "title": ["", "", "", ""], "text": [article, *others]}), corpus)
    query = Encoder(resolve("all-minilm-l6-v2")).encode(["Who designed the Zorbian lighthouse?"])
    whole = _build(corpus, tmp_path / "whole", 1)
    split = _build(corpus, tmp_path / "split", 1, "index.chunk_words=60")
    assert whole["cut_by_embedder"] == 1 and split["cut_by_embedder"] == 0 and split["chunks"]["split"] == 1
    found = {name: [p.id for p in ShardRetriever(str(tmp_path / name / "shard-000")).search(query, 10)[0]]
             for name in ("whole", "split")}
    assert found["whole"][0] != "art"  # the fact was past what the embedder read
    top = found["split"][0]
    assert top.startswith("art#") and "Elena Varga" in pq.read_table(
        tmp_path / "split" / "shard-000" / "passages.parquet").to_pandas().set_index("id").loc[top, "text"]


def _as_tokenized_before_cjk(index_dir):
    """The index as a ragsift of before 2026-12-05 left it: BM25 with bm25s' default pattern, no record in
    the shard, the pattern in the manifest."""
    import bm25s
    import Stemmer

    from actors.bm25 import BEFORE_CJK
    from jobs.index import embedding_text

    for shard in sorted(index_dir.glob("shard-*")):
        table = pq.read_table(shard / "passages.parquet")
        tokens = bm25s.tokenize([embedding_text(t, x) for t, x in zip(table["title"].to_pylist(), table["text"].to_pylist())],
                                lower=True, token_pattern=BEFORE_CJK["pattern"], stopwords="en",
                                stemmer=Stemmer.Stemmer("english"), show_progress=False)
        shutil.rmtree(shard / "bm25")
        old = bm25s.BM25(k1=0.9, b=0.4)
        old.index(tokens, show_progress=False)
        old.save(str(shard / "bm25"), show_progress=False)
    manifest = json.loads((index_dir / "manifest.json").read_text())
    manifest["bm25"]["tokenization"] = BEFORE_CJK
    (index_dir / "manifest.json").write_text(json.dumps(manifest))


def test_an_index_whose_bm25_an_earlier_ragsift_tokenized_is_retokenized_by_a_rerun_not_called_up_to_date(
        ray_session, tmp_path, monkeypatch):
    """Chinese / Japanese text was one token a clause before; such an index was "up to date" to a rerun and
    its BM25 found nothing for a Chinese question. A rerun rebuilds its BM25 from the passages (no
    re-encoding), and until then its shards tokenize queries as they were built."""
    import ray

    from actors.bm25 import BEFORE_CJK, TOKENIZATION

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["zh1", "zh2", "en"], "title": ["", "", ""],
                             "text": ["北京是中国的首都。", "东京是日本的首都。", "Paris is the capital of France."]}), corpus)
    encoder = ray.remote(HashEncoder).options(num_cpus=0).remote()
    _build(corpus, tmp_path / "idx", 1, encoders=[encoder])
    assert BM25Shard(str(tmp_path / "idx" / "shard-000")).search(["中国的首都"], 1)[0][0].id == "zh1"
    _as_tokenized_before_cjk(tmp_path / "idx")
    old = BM25Shard(str(tmp_path / "idx" / "shard-000"))
    assert old.pattern == BEFORE_CJK["pattern"] and old.search(["capital France"], 1)[0][0].id == "en"
    assert old.search(["中国的首都"], 1) == [[]]
    built = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    import jobs.ray_session

    def started(*args, **kwargs):
        raise AssertionError("Ray was started")

    with monkeypatch.context() as patched:  # nothing to encode: no Ray, no embedder, and the build's figures kept
        patched.setattr(jobs.ray_session, "init_ray", started)
        lines = []
        manifest = _build(corpus, tmp_path / "idx", 1, encoders=None, log=lines.append)
    assert any("BM25 rebuilt" in line for line in lines)
    assert manifest["bm25"]["tokenization"] == TOKENIZATION and manifest["build_s"] == built["build_s"]
    assert {k: v for k, v in manifest.items() if k != "bm25"} == {k: v for k, v in built.items() if k != "bm25"}
    assert BM25Shard(str(tmp_path / "idx" / "shard-000")).search(["中国的首都"], 1)[0][0].id == "zh1"
    again = []
    _build(corpus, tmp_path / "idx", 1, encoders=[encoder], log=again.append)
    assert "up to date" in again[0]
    # a refresh killed after its first shard: the manifest aside, one shard rebuilt; the rerun finishes it
    # from there, still with no Ray and the build's figures
    _as_tokenized_before_cjk(tmp_path / "idx")
    os.replace(tmp_path / "idx" / "manifest.json", tmp_path / "idx" / "_manifest.before-bm25.json")
    with monkeypatch.context() as patched:
        patched.setattr(jobs.ray_session, "init_ray", started)
        finished = _build(corpus, tmp_path / "idx", 1, encoders=None)
    assert finished["build_s"] == built["build_s"] and finished["bm25"]["tokenization"] == TOKENIZATION
    assert not (tmp_path / "idx" / "_manifest.before-bm25.json").exists()
    assert json.loads((tmp_path / "idx" / "manifest.json").read_text()) == finished


def test_splitting_refuses_a_corpus_id_that_ends_as_a_part_id_does(ray_session, tmp_path):
    """Scoring takes '<id>#<n>' for a part of '<id>': 'Paris#2', a passage of its own, was scored as Paris."""
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["Paris", "Paris#2", "Rome"], "text": ["short", "short too", " ".join(["w"] * 30)]}),
                   corpus)
    with pytest.raises(UserError, match=r"the corpus id 'Paris#2' ends as a split passage's part id does"):
        _build(corpus, tmp_path / "idx", 1, "index.chunk_words=10",
               encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert not (tmp_path / "idx").exists()
    _build(corpus, tmp_path / "plain", 1, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])  # unsplit: fine


def test_an_up_to_date_index_on_a_read_only_mount_is_said_so_and_one_that_is_not_is_refused_before_ray(
        ray_session, squad_slice, tmp_path):
    """A script that runs `ragsift index` before each job, on nodes that mount the index read-only, failed at the
    lease ("[Errno 30] Read-only file system: 'idx/_lease.json...'") though there was nothing to build. A real
    read-only bind mount (this needs root, as CI and the dev box have)."""
    import subprocess

    import ray

    encoder = [ray.remote(HashEncoder).options(num_cpus=0).remote()]
    _build(squad_slice[0], tmp_path / "idx", 2, encoders=encoder)
    mounted = tmp_path / "idx_ro"
    mounted.mkdir()
    if subprocess.run(["mount", "--bind", str(tmp_path / "idx"), str(mounted)], capture_output=True).returncode:
        pytest.skip("no bind mounts here (not root)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)], check=True, capture_output=True)
        lines = []
        _build(squad_slice[0], mounted, 2, encoders=encoder, log=lines.append)
        assert lines == [f"{mounted} is up to date: 2 shards built from this corpus with these settings"]
        with pytest.raises(UserError, match="this process cannot write there .*, and it is not up to date with this "
                                            "corpus and these settings: build it where it can be written"):
            _build(squad_slice[0], mounted, 3, encoders=encoder)
    finally:
        subprocess.run(["umount", str(mounted)], capture_output=True)


def test_a_shard_goes_to_a_gpu_only_when_its_actor_reserved_one(ray_session, tmp_path, monkeypatch):
    """Every shard actor copied its index onto every GPU FAISS saw, though its pool reserved none: beside
    vLLM's preallocated memory, unseen by Ray. Asked for one without a GPU FAISS, it says what to change."""
    import faiss
    import ray

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["alpha", "beta"]}), corpus)
    _build(corpus, tmp_path / "idx", 1, encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    shard = str(tmp_path / "idx" / "shard-000")
    moved = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1, raising=False)
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index: moved.append(index) or index, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", lambda res, device, index: moved.append(index) or index, raising=False)
    assert ShardRetriever(shard).size() == 2 and moved == []
    assert ShardRetriever(shard, gpu=True).size() == 2 and len(moved) == 1
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    with pytest.raises(RuntimeError, match=r"retrieval.num_gpus_per_shard > 0, but this FAISS .* sees no GPU"):
        ShardRetriever(shard, gpu=True)


def test_an_index_encoder_runs_on_the_cpu_unless_its_replica_reserved_a_gpu(tmp_path, monkeypatch):
    """`ragsift index` gave the encoder embedder.device as it was (None): the actor took "cuda when
    available", a GPU Ray had not given it, where an answer run's encoders stay on the CPU."""
    import ray

    made = []

    class Remote:
        def options(self, **options):
            return self

        def remote(self, *args):
            made.append(args)
            raise RuntimeError("stop before the build")

    monkeypatch.setattr("jobs.ray_session.init_ray", lambda *args, **kwargs: None)
    monkeypatch.setattr(ray, "remote", lambda cls: Remote())
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["alpha"]}), corpus)
    for overrides, device in (((), "cpu"), (("embedder.num_gpus=1",), None), (("embedder.device=cuda:1",), "cuda:1")):
        with pytest.raises(RuntimeError, match="stop before the build"):
            _build(corpus, tmp_path / "idx", 1, *overrides)
        assert made.pop()[2] == device
