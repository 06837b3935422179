"""Hit merging, reciprocal rank fusion and the retriever stage's dense/BM25/hybrid routing (no Ray)."""

from actors.retriever import fuse_rrf, merge_topk
from engine.stages import RetrieverStage
from schemas.config import RetrievalConfig, StageBatching
from schemas.records import Passage, Retrieve


def hits(*ids_scores):
    return [Passage(i, "", f"text {i}", s) for i, s in ids_scores]


def test_rrf_rewards_agreement_and_weights():
    dense = hits(("a", 0.9), ("b", 0.8), ("c", 0.7))
    bm25 = hits(("b", 12.0), ("d", 11.0), ("a", 3.0))
    fused = fuse_rrf([dense, bm25], [1.0, 1.0], 3, rrf_k=60)
    assert [p.id for p in fused] == ["b", "a", "d"]  # b: 1/62+1/61 > a: 1/61+1/63 > d: 1/62 > c: 1/63
    assert abs(fused[0].score - (1 / 62 + 1 / 61)) < 1e-12
    assert [p.id for p in fuse_rrf([dense, bm25], [1.0, 0.0], 2)] == ["a", "b"]  # BM25 weighted out


def test_stage_routes_each_method_and_fuses_hybrid():
    retrieval = RetrievalConfig(method="dense", fusion_candidates=3)
    stage = RetrieverStage([object()], ["shard-0", "shard-1"], StageBatching(), bm25=True, retrieval=retrieval)
    batch = [Retrieve("q1", 2), Retrieve("q2", 2, "bm25"), Retrieve("q3", 2, "hybrid")]
    # dense shards see q1 and q3 (the hybrid one), BM25 shards see q2 and q3; each to depth 3
    dense_results = [[hits(("a", 0.9)), hits(("x", 0.5), ("y", 0.4))],
                     [hits(("b", 0.95)), hits(("z", 0.45))]]
    bm25_results = [[hits(("m", 5.0)), hits(("z", 9.0))],
                    [hits(("n", 7.0), ("o", 1.0)), hits(("w", 8.0), ("x", 2.0))]]
    out = stage.combine(batch, dense_results + bm25_results)
    assert [p.id for p in out[0].passages] == ["b", "a"]
    assert [p.id for p in out[1].passages] == ["n", "m"]
    assert [p.id for p in out[2].passages] == ["z", "x"]  # dense x,z,y + BM25 z,w,x: z 1/62+1/61 > x 1/61+1/63


def test_merge_keeps_global_order_across_shards():
    merged = merge_topk([[hits(("a", 0.1), ("b", 0.05))], [hits(("c", 0.3))]], 2)
    assert [p.id for p in merged[0]] == ["c", "a"]


def test_hybrid_returns_k_hits_when_k_is_above_fusion_candidates():
    """_plan fetched max(k, fusion_candidates) from each ranking but the fusion cut them to
    fusion_candidates: k=80 came back as 50 hits."""
    stage = RetrieverStage([object()], ["shard-0"], StageBatching(), bm25=True,
                           retrieval=RetrievalConfig(fusion_candidates=2))
    dense = [[hits(*((f"d{i}", 1 - i / 10) for i in range(4)))]]
    bm25 = [[hits(*((f"d{i}", 9 - i) for i in range(4)))]]  # the same passages: fused, 2 + 2 were 2
    (out,) = stage.combine([Retrieve("q", 4, "hybrid")], dense + bm25)
    assert len(out.passages) == 4


class RowStore:
    """A shard's passages by row, with ids that say the corpus row (offset for a second shard)."""

    def __init__(self, first_row: int):
        self.first_row = first_row

    def passages(self, rows, scores):
        return [Passage(f"d{self.first_row + r:02d}", "", "the same text", s) for r, s in zip(rows, scores)]


def flat_shard(vectors, first_row):
    import faiss
    import numpy as np

    from actors.retriever import ShardRetriever

    shard = object.__new__(ShardRetriever)  # a shard without files: its FAISS index and a store
    shard.index = faiss.IndexFlatIP(vectors.shape[1])
    shard.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    shard.store = RowStore(first_row)
    return shard


def test_passages_of_equal_score_come_in_corpus_order_whatever_the_depth_or_the_shards():
    """The same text under four ids: FAISS returned them reversed, so a request's top hit changed with
    the depth its batch searched at (d00 alone, d06 beside a k=3 request) and two shards kept other
    passages than one index."""
    import numpy as np

    vectors = np.tile(np.array([[0.6, 0.8]]), (6, 1))
    vectors[[1, 4]] = [1.0, 0.0]  # two other passages, scoring lower
    query = np.array([[0.6, 0.8]])
    one = flat_shard(vectors, 0)
    assert [p.id for p in one.search(query, 1)[0]] == ["d00"]
    assert [p.id for p in one.search(query, 3)[0]] == ["d00", "d02", "d03"]
    assert [p.id for p in one.search(query, 6)[0]] == ["d00", "d02", "d03", "d05", "d01", "d04"]
    two = merge_topk([flat_shard(vectors[:3], 0).search(query, 3), flat_shard(vectors[3:], 3).search(query, 3)], 3)
    assert [p.id for p in two[0]] == ["d00", "d02", "d03"]
