"""Label records from answer rows (pure), and the label files they are written to."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.label import (
    LabelWriter,
    answer_chunks,
    raisf_labels,
    self_reasoning_labels,
)
from schemas.config import LabelConfig
from schemas.records import Passage
from schemas.tables import ANSWERS


def write_labels(output: str, kind: str, records: list[dict]) -> None:
    """One label file of ``records``, written as the label job writes its parts."""
    writer = LabelWriter(output, kind)
    writer.write(records)
    writer.close()
    writer.publish()


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
    # a gold that is null or normalises to nothing is no gold: no label, not "unknown"
    gold["c"] = {"answers": [" . ", None]}
    assert [r["id"] for r in raisf_labels(rows, gold, PASSAGES, LabelConfig())["self_knowledge"]] == ["a", "b"]
    assert json.loads(out["decomposition"][0]["messages"][1]["content"]) == {"sub_questions": ["a?", "b?"]}


def test_self_knowledge_labels_alone_are_made_from_rows_that_hold_relevance_steps_too():
    """A collect of self-knowledge alone over rows with relevance steps raised KeyError: 'relevance'."""
    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES,
                       LabelConfig(collect=["self_knowledge"]))
    assert [r["label"] for r in out["self_knowledge"]] == ["know"] and "relevance" not in out


def test_a_relevance_label_says_whether_its_passage_is_one_of_the_questions_gold_passages_where_known():
    """The rows had the judge's label only: a user training M_rel on gold positives had to join the question file."""
    gold = {"a": {"answers": ["Paris"], "gold_passage_ids": ["p1", None]}, "b": {"answers": ["Lyon"]}}
    rel = raisf_labels([row("a", "Paris", LABEL_TRACE), row("b", "Lyon", LABEL_TRACE)], gold, PASSAGES,
                       LabelConfig())["relevance"]
    assert [(r["id"], r["passage_id"], r["label"], r["gold_passage"]) for r in rel] == [
        ("a", "p0", "relevant", False), ("a", "p1", "irrelevant", True), ("b", "p0", "relevant", None),
        ("b", "p1", "irrelevant", None)]


def test_a_decomposition_that_only_repeats_the_question_is_no_label_and_each_kind_says_why_a_question_gave_none():
    """SmolLM2 decomposed 7 of 9 questions into the question itself (RA-ISF drops such sub-questions), and
    they were written as M_decom's targets; an error row was not counted anywhere."""
    repeats = [{"step": "closed_book", "output": "x"},
               {"step": "decompose", "sub_questions": ["Question A", "question a?", "b?", "B ?"], "parsed": True}]
    rows = [row("a", "Paris", repeats), row("b", "x", [{"step": "decompose", "sub_questions": ["Question b."],
                                                         "parsed": True}]),
            row("c", "x", LABEL_TRACE) | {"error": "generator failed 3 times: boom"}, row("d", "x", [])]
    gold = {"a": {"answers": ["Paris"]}, "b": {"answers": ["Lyon"]}, "c": {"answers": ["Nice"]}}
    dropped = {kind: Counter() for kind in ("self_knowledge", "relevance", "decomposition")}
    out = raisf_labels(rows, gold, PASSAGES, LabelConfig(), dropped)
    assert [(r["id"], r["sub_questions"]) for r in out["decomposition"]] == [("a", ["b?"])]  # each once, never the question
    assert dropped["decomposition"] == {"only repeats the question": 1, "error row": 1, "no parsed decomposition": 1}
    assert [r["id"] for r in out["self_knowledge"]] == ["a", "b"]
    assert dropped["self_knowledge"] == {"error row": 1, "no gold answer": 1}
    assert dropped["relevance"] == {"error row": 1, "no passage retrieved": 3}


def test_only_the_collected_kinds_are_labelled():
    """label.collect=[relevance] still wrote self-knowledge labels, and the card said only relevance was collected."""
    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES,
                       LabelConfig(collect=["relevance"]))
    assert list(out) == ["relevance"] and len(out["relevance"]) == 2


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
    kept, dropped = self_reasoning_labels(rows + [row("e", "", [], "self_reasoning") | {"error": "boom"}], gold,
                                          PASSAGES, LabelConfig())
    assert [r["id"] for r in kept] == ["a", "c", "f"]
    assert dropped == {"wrong answer": 1, "no parsed trajectory": 1, "error row": 1}
    a = kept[0]
    assert (a["citation_precision"], a["citation_recall"]) == (1.0, 1.0)
    assert "[1] T0: text 0" in a["messages"][0]["content"]
    assert json.loads(a["messages"][1]["content"])["cite_list"][0]["cite_index"] == 1
    assert "SUPPORT" in kept[2]["messages"][0]["content"]  # the fact-verification prompt for claims
    kept, dropped = self_reasoning_labels(rows, gold, PASSAGES, LabelConfig(citation_filter=True))
    assert [r["id"] for r in kept] == ["a", "f"] and dropped["citations under threshold"] == 1
    # a null or empty gold id names no passage: citing the one real gold is recall 1 (0.5 before: dropped)
    gold["a"]["gold_passage_ids"] = ["p0", None, ""]
    kept, _ = self_reasoning_labels(rows, gold, PASSAGES, LabelConfig(citation_filter=True))
    assert [r["id"] for r in kept] == ["a", "f"] and kept[0]["citation_recall"] == 1.0


def test_a_trajectory_is_kept_by_its_own_answer_not_by_the_later_read_of_it():
    """Under answer_step read the row's answer is a read of the trajectory: a trajectory answering Lyon was
    kept as a training target because the read said Paris, and a right one dropped for a wrong read."""
    gold = {"a": {"answers": ["Paris", None]}, "b": {"answers": ["Paris"]}}
    rows = [row("a", "Paris", trajectory("Lyon"), "self_reasoning"), row("b", "Lyon", trajectory("Paris"), "self_reasoning")]
    kept, dropped = self_reasoning_labels(rows, gold, PASSAGES, LabelConfig())
    assert [r["id"] for r in kept] == ["b"] and dropped == {"wrong answer": 1}
    assert kept[0]["gold_answers"] == ["Paris"]


def test_label_files_are_parquet_and_chat_jsonl(tmp_path):
    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES, LabelConfig())
    write_labels(str(tmp_path), "relevance", out["relevance"])
    table = pq.read_table(tmp_path / "labels" / "relevance.parquet")
    assert table.column_names == ["id", "question", "passage_id", "passage", "p_yes", "label", "gold_passage"]
    lines = [json.loads(line) for line in (tmp_path / "labels" / "relevance.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and [m["role"] for m in lines[0]["messages"]] == ["user", "assistant"]


def test_label_files_are_written_in_chunks_with_a_fixed_schema(tmp_path):
    """A first chunk with no citation scores (null) must not fix the column type for later ones."""
    writer = LabelWriter(str(tmp_path), "self_reasoning")
    common = {"question": "q?", "passage_ids": ["p0"], "trajectory": "{}", "answer": "a", "gold_answers": ["a"],
              "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}
    writer.write([{"id": "a", **common, "citation_precision": None, "citation_recall": None}])
    writer.write([])
    writer.write([{"id": "b", **common, "citation_precision": 0.5, "citation_recall": 1.0}])
    writer.close()
    writer.publish()
    table = pq.read_table(tmp_path / "labels" / "self_reasoning.parquet")
    assert table["citation_precision"].to_pylist() == [None, 0.5] and table.schema.field("citation_recall").type == pa.float64()
    assert writer.records == 2 and len((tmp_path / "labels" / "self_reasoning.jsonl").read_text().splitlines()) == 2
    write_labels(str(tmp_path), "decomposition", [])  # no records: an empty file that still has the columns
    assert pq.read_table(tmp_path / "labels" / "decomposition.parquet").column_names == ["id", "question", "sub_questions"]


def test_answers_are_read_in_chunks_of_whole_parts_bounded_by_passages(tmp_path):
    (tmp_path / "raisf_labels").mkdir()
    for part in range(3):
        rows = [row(f"q{part}", "x", LABEL_TRACE) | {"retrieved_ids": [f"p{part}a", f"p{part}b"]}]
        rows = [{name: r.get(name) for name in ANSWERS.names} for r in rows]
        pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), tmp_path / "raisf_labels" / f"part-{part:05d}.parquet")
    chunks = list(answer_chunks(str(tmp_path), "raisf_labels", max_passage_ids=4))
    assert [[r["id"] for r in rows] for rows, _ in chunks] == [["q0", "q1"], ["q2"]]
    assert chunks[0][1] == {"p0a", "p0b", "p1a", "p1b"}
    assert len(list(answer_chunks(str(tmp_path), "raisf_labels", max_passage_ids=1))) == 3  # a part is never split


def test_a_label_run_becomes_a_dataset_folder_with_a_card_that_loads_like_a_hub_repository(tmp_path):
    import datasets
    import yaml

    from jobs.dataset_card import write_dataset
    from strategies.registry import AnswerConfig

    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES, LabelConfig())
    for kind in ("self_knowledge", "relevance", "decomposition"):
        write_labels(str(tmp_path), kind, out[kind])
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["question a?"]}), questions)
    config = AnswerConfig(questions=str(questions), output=str(tmp_path), strategies=["raisf_labels"],
                          label={"license": "cc-by-sa-4.0", "source_licenses": "NQ: CC BY-SA 3.0"})
    summary = {"self_knowledge": {"records": 1, "know": 1}, "relevance": {"records": 2, "relevant": 1, "irrelevant": 1},
               "decomposition": {"records": 1}, "self_reasoning": {"records": 0, "of": 1, "dropped": {"wrong": 1}}}
    folder = write_dataset(str(tmp_path), summary, config)

    card = (tmp_path / "labels" / "dataset" / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["license"] == "cc-by-sa-4.0" and [c["config_name"] for c in header["configs"]] == [
        "self_knowledge", "relevance", "decomposition"]  # nothing kept of self_reasoning: no empty config
    assert "NQ: CC BY-SA 3.0" in card and "| `relevance` |" in card and "raisf/relevance.txt" in card
    relevance = datasets.load_dataset(folder, "relevance", split="train", cache_dir=str(tmp_path / "hf_cache"))
    assert relevance.num_rows == 2 and relevance["label"] == ["relevant", "irrelevant"]
    assert [m["role"] for m in relevance[0]["messages"]] == ["user", "assistant"]
    # rerun into the same output keeping no relevance label: the old rows leave the folder a push uploads
    write_labels(str(tmp_path), "relevance", [])
    write_dataset(str(tmp_path), {**summary, "relevance": {"records": 0}}, config)
    assert not (tmp_path / "labels" / "dataset" / "data" / "relevance.parquet").exists()


def test_a_label_run_killed_before_it_is_done_leaves_the_last_runs_label_files_whole(tmp_path):
    """The files were written under their own names: a kill while labelling left them cut to nothing, beside a
    summary and a dataset that still counted their records, and `train know` could not read them."""
    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES, LabelConfig())
    write_labels(str(tmp_path), "relevance", out["relevance"])
    writer = LabelWriter(str(tmp_path), "relevance")  # a second run, killed before it publishes
    writer.write(out["relevance"][:1])
    assert pq.read_table(tmp_path / "labels" / "relevance.parquet").num_rows == 2
    assert len((tmp_path / "labels" / "relevance.jsonl").read_text().splitlines()) == 2
    writer.close()
    writer.publish()
    assert pq.read_table(tmp_path / "labels" / "relevance.parquet").num_rows == 1


def test_a_rerun_labelling_fewer_kinds_removes_the_earlier_runs_files_of_the_others_and_says_so(tmp_path):
    """Rerun with --strategy raisf_labels only: the summary and the dataset dropped self_reasoning, while its
    label files stayed beside them, counted by neither."""
    from jobs.label import remove_unlabelled

    out = raisf_labels([row("a", "Paris", LABEL_TRACE)], {"a": {"answers": ["Paris"]}}, PASSAGES, LabelConfig())
    for kind in ("relevance", "self_reasoning"):
        write_labels(str(tmp_path), kind, out["relevance"] if kind == "relevance" else [])
    said = []
    remove_unlabelled(str(tmp_path), {"relevance": {"records": 2}}, said.append)
    assert sorted(p.name for p in (tmp_path / "labels").iterdir()) == ["relevance.jsonl", "relevance.parquet"]
    assert len(said) == 2 and "did not label self_reasoning" in said[0]


def test_the_card_names_the_users_questions_file_and_its_sha256_not_only_the_converted_copy(tmp_path):
    import hashlib

    from jobs.answer import with_questions_read
    from jobs.dataset_card import card_text
    from strategies.registry import AnswerConfig

    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    given = AnswerConfig(questions=str(jsonl), output=str(tmp_path / "lab"), strategies=["raisf_labels"])
    config = with_questions_read(given)
    card = card_text([], {}, config, source=given.questions)
    assert f"`{jsonl}` (sha256 of the file: `{hashlib.sha256(jsonl.read_bytes()).hexdigest()}`)" in card
    assert f"read as ragsift's Parquet copy `{config.questions}`" in card


def test_questions_without_answers_are_refused_before_answering_when_every_kind_asked_needs_gold(tmp_path, monkeypatch):
    """`ragsift label` answered every question before it noticed there was no `answers` column, then exited 0
    with nothing labelled; where some kinds need no gold, the others' emptiness was said only at the end."""
    from jobs import label as label_job
    from schemas.errors import UserError
    from strategies.registry import AnswerConfig

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), questions)
    said, answered = [], []

    def answer(config, log, force):
        answered.append(config.strategies)
        raise RuntimeError("answered")

    monkeypatch.setattr(label_job.answer_job, "answer", answer)
    for strategies, collect in ((["self_reasoning"], []), (["raisf_labels", "self_reasoning"], ["self_knowledge"])):
        config = AnswerConfig(questions=str(questions), output=str(tmp_path / "out"), strategies=strategies,
                              label={"collect": collect or ["self_knowledge"]})
        with pytest.raises(UserError, match=r"no `answers` column, and every kind asked \(.*\) is labelled against gold"):
            label_job.label(config, log=said.append)
    assert not answered
    config = AnswerConfig(questions=str(questions), output=str(tmp_path / "out"), strategies=["raisf_labels", "self_reasoning"])
    with pytest.raises(RuntimeError, match="answered"):
        label_job.label(config, log=said.append)
    assert said == ["warning: no `answers` column: self_knowledge and self_reasoning will have no labels (they need gold "
                    "answers); labelling relevance, decomposition"]


def test_the_card_names_the_embedder_of_the_index_the_labels_were_retrieved_from(tmp_path):
    """It named `embedder.model` of the config, which a run does not use where its index was built with another."""
    import json

    from jobs.dataset_card import card_text
    from jobs.index import MANIFEST
    from strategies.registry import AnswerConfig

    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / MANIFEST).write_text(json.dumps({"embedder": "intfloat/e5-small-v2", "shards": []}))
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    config = AnswerConfig(questions=str(questions), output=str(tmp_path / "lab"), strategies=["raisf_labels"],
                          index={"path": str(tmp_path / "idx")})
    assert "embedder `intfloat/e5-small-v2`" in card_text([], {}, config)


def test_self_knowledge_reads_a_claim_label_of_the_runs_verdicts_as_a_label_not_words_to_find():
    """With labels that contain each other, the closed-book 'NOT SUPPORTED' counted as knowing 'SUPPORTED'."""
    gold = {"a": {"answers": ["SUPPORTED"]}, "b": {"answers": ["NOT SUPPORTED"]}}
    rows = [row("a", "NOT SUPPORTED", LABEL_TRACE), row("b", "NOT SUPPORTED", LABEL_TRACE)]
    out = raisf_labels(rows, gold, PASSAGES, LabelConfig(match="contains"), verdicts=("SUPPORTED", "NOT SUPPORTED"))
    assert [(r["id"], r["label"]) for r in out["self_knowledge"]] == [("a", "unknown"), ("b", "know")]
