"""Label records from answer rows (pure), and the label files they are written to."""

import json

import pyarrow.parquet as pq

from jobs.label import raisf_labels, self_reasoning_labels, write_labels
from schemas.config import LabelConfig
from schemas.records import Passage

PASSAGES = {f"p{i}": Passage(f"p{i}", f"T{i}", f"text {i}", 0.0) for i in range(3)}


def row(qid, answer, trace, strategy="raisf_labels", **extra):
    return {"id": qid, "question": f"question {qid}?", "strategy": strategy, "answer": answer, "error": None,
            "trace": json.dumps(trace), "retrieved_ids": ["p0", "p1"], "citations": [], **extra}


LABEL_TRACE = [{"step": "closed_book", "output": "Paris."},
               {"step": "decompose", "sub_questions": ["a?", "b?"], "parsed": True},
               {"step": "retrieve", "ids": ["p0", "p1"]},
               {"step": "relevance", "p_yes": [0.9, 0.1], "relevant": [True, False]}]


def test_raisf_labels_follow_appendix_a():
    gold = {"a": {"answers": ["Paris"]}, "b": {"answers": ["Lyon"]}}
    rows = [row("a", "Paris", LABEL_TRACE), row("b", "the city of Lyon", LABEL_TRACE),
            row("c", "x", [{"step": "decompose", "sub_questions": [], "parsed": False}])]
    out = raisf_labels(rows, gold, PASSAGES, LabelConfig())
    assert [(r["id"], r["label"]) for r in out["self_knowledge"]] == [("a", "know"), ("b", "unknown")]
    assert out["self_knowledge"][0]["messages"][0]["content"].startswith("Can you use your own knowledge")
    assert out["self_knowledge"][0]["messages"][1] == {"role": "assistant", "content": "yes"}
    # 'contains' counts a gold answer inside the closed-book answer as known
    assert [r["label"] for r in raisf_labels(rows, gold, PASSAGES, LabelConfig(match="contains"))["self_knowledge"]] == [
        "know", "know"]
    rel = out["relevance"]
    assert [(r["id"], r["passage_id"], r["label"]) for r in rel] == [
        ("a", "p0", "relevant"), ("a", "p1", "irrelevant"), ("b", "p0", "relevant"), ("b", "p1", "irrelevant")]
    assert "Paragraph: T1: text 1" in rel[1]["messages"][0]["content"] and rel[1]["messages"][1]["content"] == "no"
    # c: no gold -> no self-knowledge label; unparsed decomposition -> no pair
    assert [r["id"] for r in out["decomposition"]] == ["a", "b"]
    assert json.loads(out["decomposition"][0]["messages"][1]["content"]) == {"sub_questions": ["a?", "b?"]}


def trajectory(answer):
    return [{"step": "retrieve", "ids": ["p0", "p1"]},
            {"step": "trajectory", "relevant": True, "relevant_reason": "r", "analysis": "see [1]", "answer": answer,
             "cite_list": [{"cite_index": 1, "cite_content": "text 0", "cite_reason": "states it"}]}]


def test_self_reasoning_keeps_only_correct_trajectories_and_optionally_well_cited_ones():
    gold = {"a": {"answers": ["Paris"], "gold_passage_ids": ["p0"]}, "b": {"answers": ["Lyon"]},
            "c": {"answers": ["Nice"], "gold_passage_ids": ["p1"]}, "f": {"answers": ["SUPPORTS"], "kind": "claim"}}
    rows = [row("a", "Paris", trajectory("Paris"), "self_reasoning", citations=["p0"]),
            row("b", "Marseille", trajectory("Marseille"), "self_reasoning"),
            row("c", "Nice", trajectory("Nice"), "self_reasoning", citations=["p0"]),
            row("d", "x", [{"step": "trajectory", "parsed": False, "output": "{"}], "self_reasoning"),
            row("f", "SUPPORTS", trajectory("SUPPORT"), "self_reasoning")]
    kept, dropped = self_reasoning_labels(rows, gold, PASSAGES, LabelConfig())
    assert [r["id"] for r in kept] == ["a", "c", "f"]
    assert dropped == {"wrong answer": 1, "no parsed trajectory": 1}
    a = kept[0]
    assert (a["citation_precision"], a["citation_recall"]) == (1.0, 1.0)
    assert "[1] T0: text 0" in a["messages"][0]["content"]
    assert json.loads(a["messages"][1]["content"])["cite_list"][0]["cite_index"] == 1
    assert "SUPPORT" in kept[2]["messages"][0]["content"]  # the fact-verification prompt for claims
    kept, dropped = self_reasoning_labels(rows, gold, PASSAGES, LabelConfig(citation_filter=True))
    assert [r["id"] for r in kept] == ["a", "f"] and dropped["citations under threshold"] == 1


def test_label_files_are_parquet_and_chat_jsonl(tmp_path):
    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES, LabelConfig())
    write_labels(str(tmp_path), "relevance", out["relevance"])
    table = pq.read_table(tmp_path / "labels" / "relevance.parquet")
    assert table.column_names == ["id", "question", "passage_id", "passage", "p_yes", "label"]
    lines = [json.loads(line) for line in (tmp_path / "labels" / "relevance.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and [m["role"] for m in lines[0]["messages"]] == ["user", "assistant"]
