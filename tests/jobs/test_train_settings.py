"""``ragsift train``'s settings: typed, layered like every job's (defaults, --config, --set, flags), and
refused before anything is read or trained when a value is not valid."""

import pytest
import yaml

from jobs import train
from jobs.cli import _parser, main
from jobs.train import settings
from schemas.config import ConfigError


def parse(argv: list[str]):
    return _parser("train", train).parse_args(argv)


def test_flags_override_set_which_overrides_the_config_file_which_overrides_the_defaults(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"epochs": 3, "batch_size": 8, "held_out": 0.2}))
    got = settings(parse(["relevance", "--pairs", "p.parquet", "--output", "m", "--config", str(config),
                          "--set", "batch_size=16", "--set", "held_out=0.3", "--held-out", "0.25",
                          "--exclude", "a.txt", "--exclude", "b.txt", "--bf16"]))
    assert (got.epochs, got.batch_size, got.held_out) == (3.0, 16, 0.25)
    assert got.exclude == ["a.txt", "b.txt"] and got.bf16 is True
    assert (got.learning_rate, got.architecture, got.mine_only) == (5e-5, "bi-encoder", False)  # defaults


def test_a_held_out_share_that_leaves_nothing_to_train_on_is_one_line_naming_the_field(tmp_path, capsys):
    code = main(["train", "know", "--labels", str(tmp_path), "--output", str(tmp_path / "m"), "--held-out", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "held_out" in err and "less than 1" in err
    assert not (tmp_path / "m").exists()


def test_mining_and_training_from_mined_pairs_are_one_or_the_other(tmp_path, capsys):
    assert main(["train", "relevance", "--pairs", "p.parquet", "--mine-only", "--output", str(tmp_path / "m")]) == 2
    assert "mine_only mines pairs" in capsys.readouterr().err
    assert main(["train", "relevance", "--questions", "q.parquet", "--output", str(tmp_path / "m")]) == 2
    assert "give questions and index_dir" in capsys.readouterr().err


def test_an_unknown_architecture_or_a_mistyped_setting_is_refused_naming_it(tmp_path, capsys):
    base = ["train", "relevance", "--pairs", "p.parquet", "--output", str(tmp_path / "m")]
    assert main([*base, "--architecture", "t5"]) == 2
    assert "architecture" in capsys.readouterr().err
    assert main([*base, "--set", "epoch=2"]) == 2
    assert "epoch" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_debug_shows_the_traceback_given_before_or_after_the_judge(tmp_path):
    """README: --debug on any job; `ragsift train relevance ... --debug` was refused as an unknown argument."""
    base = ["relevance", "--pairs", "p.parquet", "--output", str(tmp_path / "m"), "--architecture", "t5"]
    for argv in (["train", *base, "--debug"], ["train", "--debug", *base]):
        with pytest.raises(ConfigError, match="architecture"):
            main(argv)
    assert main(["train", *base]) == 2


def test_an_exclude_flag_adds_to_the_config_files_list_and_never_drops_it(tmp_path):
    # the config's list is what keeps the reported slices out of training: a flag must not replace it
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"exclude": ["eval.txt"], "output": "m", "pairs": "p.parquet"}))
    got = settings(parse(["relevance", "--config", str(config), "--exclude", "extra.txt"]))
    assert got.exclude == ["eval.txt", "extra.txt"] and got.output == "m"  # output from the file alone


def test_a_file_that_lacks_a_column_training_reads_is_one_line_naming_the_column(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), tmp_path / "q.parquet")
    assert main(["train", "relevance", "--pairs", str(tmp_path / "q.parquet"), "--output", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column ['passage', 'label']" in err
    assert main(["train", "relevance", "--questions", str(tmp_path / "q.parquet"), "--index-dir", str(tmp_path),
                 "--output", str(tmp_path / "m")]) == 2
    assert "no column ['gold_passage_ids']" in capsys.readouterr().err


def test_excluded_ids_come_from_question_files_of_every_format_and_from_id_lists_as_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.train_data import excluded_ids

    (tmp_path / "eval.jsonl").write_text('{"id": "nq-1", "question": "q"}\n{"id": "nq-2", "question": "q"}\n')
    (tmp_path / "eval.csv").write_text("id,question\nsq-1,q\n")
    (tmp_path / "ids.txt").write_text("\ufeffhp-1\n\nhp-2\n", encoding="utf-8")  # a BOM, a blank line
    pq.write_table(pa.table({"id": [7, 8], "question": ["q", "q"]}), tmp_path / "ints.PARQUET")
    sources = [str(tmp_path / n) for n in ("eval.jsonl", "eval.csv", "ids.txt", "ints.PARQUET")]
    assert excluded_ids(sources) == {"nq-1", "nq-2", "sq-1", "hp-1", "hp-2", "7", "8"}


def test_too_few_labels_for_the_held_out_split_say_so(tmp_path):
    """Two labels, both classes, the know one held out: the error said the file lacked a class."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.train_data import held_out
    from jobs.train_know import train_know
    from schemas.errors import UserError
    from schemas.training import KnowTraining

    out_id = next(f"k{i}" for i in range(1000) if held_out(f"k{i}", 0.5))
    in_id = next(f"u{i}" for i in range(1000) if not held_out(f"u{i}", 0.5))
    (tmp_path / "labels" / "labels").mkdir(parents=True)
    pq.write_table(pa.table({"id": [out_id, in_id], "question": ["a?", "b?"], "label": ["know", "unknown"]}),
                   tmp_path / "labels" / "labels" / "self_knowledge.parquet")
    with pytest.raises(UserError, match="after the held-out split"):
        train_know(KnowTraining(labels=str(tmp_path / "labels"), output=str(tmp_path / "m"), held_out=0.5), print)


def test_settings_of_mining_given_with_pairs_mined_earlier_are_refused_not_ignored(tmp_path, capsys):
    base = ["train", "relevance", "--pairs", "p.parquet", "--output", str(tmp_path / "m")]
    for extra in (["--limit", "2"], ["--per-dataset", "1"], ["--negatives", "0"]):
        assert main([*base, *extra]) == 2  # training used every pair, the card silent about the flag
        assert "settings of mining, which pairs (p.parquet) was done with" in capsys.readouterr().err


@pytest.mark.parametrize("labels, message", [
    ([1.0, float("nan"), 0.0, 0.0], "a pair's label is nan"),
    ([1.0, 1.0, 1.0, 1.0], "not of both classes"),
    ([0.0, 0.0, 0.0, 0.0], "not of both classes"),
])
def test_pairs_of_one_class_or_with_a_label_that_is_not_0_or_1_are_refused_before_training(tmp_path, capsys, labels,
                                                                                          message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(4)], "question": ["Who?"] * 4, "passage": ["p"] * 4,
                             "label": labels}), pairs)
    # a cross-encoder trained on positives alone (loss 0) was written and served; NaN trained as relevant
    assert main(["train", "relevance", "--pairs", str(pairs), "--output", str(tmp_path / "m"), "--held-out", "0",
                 "--architecture", "cross-encoder"]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_a_question_whose_gold_passage_ids_are_null_or_empty_has_no_gold_to_mine_from(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.questions import by_first_id
    from jobs.relevance_pairs import collect_pairs
    from schemas.errors import UserError
    from schemas.training import RelevanceTraining

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["Who?", "What?"],
                             "gold_passage_ids": [[None], ["", None]]}), questions)
    # mined as gold before (a None among the ids then crashed the passage lookup after encoding)
    settings = RelevanceTraining(questions=str(questions), index_dir=str(tmp_path), output=str(tmp_path / "m"))
    with pytest.raises(UserError, match="no question with gold passages left to train on"):
        collect_pairs(settings, log=lambda *a: None)
    assert by_first_id([{"id": "a", "gold_passage_ids": ["p1", None, ""]}])["a"]["gold_passage_ids"] == ["p1"]


def test_a_model_folder_is_written_only_where_train_may_replace_what_is_there_and_is_emptied_first(tmp_path, capsys):
    """A cross-encoder trained into a bi-encoder's folder kept its relevance_logit.json and pooling
    modules, and was served as a bi-encoder nobody trained (held-out AUC 0.84 served, 0.64 on its card)."""
    from jobs.train_data import check_output, staged
    from schemas.errors import UserError

    old = tmp_path / "m_rel"
    (old / "1_Pooling").mkdir(parents=True)
    for name in ("card.json", "relevance_logit.json", "modules.json"):
        (old / name).write_text("{}")
    (old / "_checkpoints").mkdir()
    check_output(str(old))  # an earlier training's folder: replaced whole
    with staged(str(old)) as folder:
        (folder / "model.safetensors").write_text("new")
    assert [p.name for p in old.iterdir()] == ["model.safetensors"]
    killed = tmp_path / "killed"  # a training killed before it wrote: its rerun was refused
    (killed / "_checkpoints").mkdir(parents=True)
    check_output(str(killed))
    theirs = tmp_path / "notes"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("mine")
    with pytest.raises(UserError, match="holds files that no `ragsift train` wrote"):
        check_output(str(theirs))
    # an object store: a local folder named "s3:" was written and "wrote s3://..." said
    for argv in (["know", "--labels", str(tmp_path), "--output", "s3://bucket/m_know"],
                 ["know", "--labels", "s3://bucket/labels", "--output", str(tmp_path / "k")],
                 ["relevance", "--pairs", "p.parquet", "--output", "s3://bucket/m_rel"]):
        assert main(["train", *argv]) == 2
        assert "copy it" in capsys.readouterr().err
    assert not (tmp_path / "s3:").exists()


def test_an_exclude_file_that_is_neither_text_nor_a_named_question_file_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.train_data import excluded_ids
    from schemas.errors import UserError

    pq.write_table(pa.table({"id": ["a"]}), tmp_path / "sample.pq")
    with pytest.raises(UserError, match="not a list of ids"):  # a UnicodeDecodeError traceback before
        excluded_ids([str(tmp_path / "sample.pq")])
    (tmp_path / "ids.txt").write_text("a\nb\n")
    assert excluded_ids([f"file://{tmp_path / 'ids.txt'}"]) == {"a", "b"}  # "No such file: 'file:/...'" before


def test_the_relevance_cards_counts_are_of_the_questions_really_mined_and_trained_on(tmp_path, monkeypatch):
    """--exclude of ids matching none of the questions said 300 excluded; a repeated id was mined twice;
    an empty question mined; and pairs excluded when training kept the mining's question counts."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    import jobs.relevance_pairs as mining
    from schemas.training import RelevanceTraining

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "b", "c", "d"], "question": ["Who?", "What?", "What?", " ", "When?"],
                             "dataset": ["nq", "squad", "squad", "nq", "nq"],
                             "gold_passage_ids": [["p1"], ["p2"], ["p2"], ["p3"], ["p4"]]}), questions)
    (tmp_path / "ids.txt").write_text("d\nnot-here\n")
    mined = []
    monkeypatch.setattr(mining, "mine_pairs", lambda rows, *a, **k: mined.extend(rows) or [
        {"id": r["id"], "question": r["question"], "passage": "p", "label": float(i % 2)} for i, r in enumerate(rows)])
    settings = RelevanceTraining(questions=str(questions), index_dir=str(tmp_path), output=str(tmp_path / "m"),
                                 exclude=[str(tmp_path / "ids.txt")])
    pairs, source = mining.collect_pairs(settings, log=lambda *a: None)
    assert [r["id"] for r in mined] == ["a", "b"] and source["excluded_questions"] == 1
    assert (source["questions_used"], source["datasets"]) == (2, {"nq": 1, "squad": 1})
    # trained from the mined file, excluding "a" now: the card counts what is trained on
    mining.write_pairs(pairs, source, str(tmp_path / "mined"))
    (tmp_path / "a.txt").write_text("a\n")
    again = RelevanceTraining(pairs=str(tmp_path / "mined" / "pairs.parquet"), output=str(tmp_path / "m"),
                              exclude=[str(tmp_path / "a.txt")])
    kept, source = mining.collect_pairs(again, log=lambda *a: None)
    assert {p["id"] for p in kept} == {"b"} and (source["questions_used"], source["datasets"]) == (1, {"squad": 1})
    assert json.dumps(source)  # the provenance still travels as JSON
    # a pairs file cut by hand (no --exclude): its card copied the mining's counts, 2 questions for 1 trained on
    mined = pq.read_table(tmp_path / "mined" / "pairs.parquet")
    pq.write_table(mined.slice(0, 1), tmp_path / "cut.parquet")
    kept, source = mining.collect_pairs(RelevanceTraining(pairs=str(tmp_path / "cut.parquet"), output=str(tmp_path / "m")),
                                        log=lambda *a: None)
    assert len(kept) == 1 and (source["questions_used"], source["datasets"]) == (1, {"nq": 1})
    assert "excluded_when_training" not in source


def test_a_label_runs_metadata_names_the_judge_of_its_relevance_labels():
    from jobs.identity import judges_name
    from strategies.registry import AnswerConfig

    config = AnswerConfig(strategies=["raisf_labels"], generator={"model": "g"}, judge={"model": "j"})
    assert judges_name(config) == {"self_knowledge": "closed-book answer of g against gold", "relevance": "P('yes') of j"}


def test_a_relevance_training_killed_while_saving_leaves_the_earlier_model_whole_never_weights_without_their_logit(
        tmp_path, monkeypatch):
    """The weights were saved into --output before relevance_logit.json: a kill between left a bi-encoder
    without its logit, which the reranker served as a cross-encoder with a random head."""
    import json
    from pathlib import Path

    import jobs.train_relevance as training
    from actors.reranker import LOGIT
    from schemas.training import RelevanceTraining

    output = tmp_path / "m_rel"
    output.mkdir()
    earlier = {"card.json": '{"architecture": "bi-encoder"}', "config.json": '{"architectures": ["BertModel"]}',
               LOGIT: '{"scale": 5.0, "bias": -2.0}', "pairs.parquet": "mined"}
    for name, text in earlier.items():
        (output / name).write_text(text)
    pairs = [{"id": f"q{i}", "question": f"question {i}", "passage": f"passage {i}", "label": float(i % 2)}
             for i in range(40)]

    class Dataset(list):
        def select(self, rows):
            return Dataset(self[i] for i in rows)

    class Trainer:
        train_dataset = Dataset(range(8))
        state = type("State", (), {"log_history": []})

        def evaluate(self, dataset):
            return {"eval_loss": 1.0}

        def train(self):
            pass

    class Model:
        killed = True

        def save_pretrained(self, folder):  # the weights land, then the process is killed
            (Path(folder) / "config.json").write_text('{"architectures": ["BertModel"]}')
            (Path(folder) / "model.safetensors").write_text("new weights")
            if self.killed:
                raise KeyboardInterrupt

    monkeypatch.setattr(training, "collect_pairs", lambda settings, log: (pairs, {}))
    monkeypatch.setattr(training, "bi_encoder_trainer", lambda *a: (Model(), Trainer()))
    monkeypatch.setattr(training, "relevance_scores", lambda model, ps, bi: [p["label"] + 0.1 * (i % 3)
                                                                             for i, p in enumerate(ps)])
    monkeypatch.setattr(training, "base_cosine_auc", lambda base, ps: 0.5)
    settings = RelevanceTraining(pairs=str(output / "pairs.parquet"), output=str(output), held_out=0.3, threads=1)
    with pytest.raises(KeyboardInterrupt):
        training.train_relevance(settings, log=lambda *a: None)
    assert {p.name: p.read_text() for p in output.iterdir() if p.is_file()} == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["m_rel"]  # nothing half-written left beside it
    Model.killed = False
    training.train_relevance(settings, log=lambda *a: None)  # not killed: the new model, whole, and the pairs kept
    assert sorted(p.name for p in output.iterdir()) == sorted(["README.md", "card.json", "config.json", LOGIT,
                                                               "model.safetensors", "pairs.parquet"])
    assert json.loads((output / LOGIT).read_text())["scale"] > 0 and (output / "pairs.parquet").read_text() == "mined"
    assert [p.name for p in tmp_path.iterdir()] == ["m_rel"]


def test_a_folder_that_is_no_self_knowledge_classifier_given_as_know_model_says_so(tmp_path):
    """An M_rel folder as know.model ended in "[Errno 2] No such file or directory: '.../know.json'"."""
    from actors.know import embedder_of
    from schemas.errors import UserError

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"not a self-knowledge classifier.*M_rel belongs in reranker.model"):
        embedder_of(str(tmp_path))


@pytest.mark.parametrize("damaged", ['{"embedder": "all-minilm', "", '{"coef": [1.0]}', "[]"])
def test_a_damaged_know_json_is_a_one_line_error_naming_it_not_a_traceback(tmp_path, damaged):
    from actors.know import embedder_of
    from schemas.errors import UserError

    (tmp_path / "know.json").write_text(damaged)
    with pytest.raises(UserError, match=r"know.model .*: its know.json does not read .*train it again"):
        embedder_of(str(tmp_path))


def test_gold_ids_that_name_no_passage_of_the_index_are_said_when_mining_and_none_at_all_is_refused(tmp_path,
                                                                                                   monkeypatch):
    """Gold ids missing from the index gave their questions negatives only, without a word; all missing (a wrong
    --index-dir), `--mine-only` wrote pairs with 0 positives and the training, maybe elsewhere, refused them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import jobs.relevance_pairs as mining
    from schemas.errors import UserError
    from schemas.training import RelevanceTraining

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "question": ["Who?", "What?", "When?"],
                             "gold_passage_ids": [["p1"], ["zz2"], ["zz3"]]}), questions)
    in_index = {"p1"}
    monkeypatch.setattr(mining, "mine_pairs", lambda rows, *a, **k: [
        {"id": r["id"], "question": r["question"], "passage": "x", "label": float(g in in_index)}
        for r in rows for g in r["gold_passage_ids"]])
    settings = RelevanceTraining(questions=str(questions), index_dir=str(tmp_path), output=str(tmp_path / "m"))
    said = []
    pairs, source = mining.collect_pairs(settings, log=said.append)
    assert source["questions_with_gold_in_index"] == 1 and "2 of the questions have no gold passage in the index" in said[0]
    in_index.clear()
    with pytest.raises(UserError, match=r"no gold passage id of the 3 questions names a passage of"):
        mining.collect_pairs(settings, log=said.append)


def test_a_training_of_a_few_steps_takes_them_at_its_learning_rate():
    """warmup_steps=0.1 of one step was that step at learning rate 0: the model written was the base model."""
    from jobs.train_relevance import warmup
    from schemas.training import RelevanceTraining

    settings = RelevanceTraining(pairs="p.parquet", output="m", batch_size=32, epochs=1)
    assert [warmup(n, settings) for n in (16, 32 * 9, 32 * 10, 3200)] == [0, 0, 1, 10]


@pytest.mark.model
def test_train_know_keeps_the_pairs_in_its_folder_writes_whole_and_names_the_generator_of_its_labels(tmp_path):
    """It cleared the folder first (a mined pairs.parquet was deleted; a failed write left it empty), and its card did
    not say whose closed-book answers the labels judged."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.train_know import train_know
    from schemas.training import KnowTraining

    labels = tmp_path / "lab"
    (labels / "labels").mkdir(parents=True)
    (labels / "config.yaml").write_text("generator:\n  model: smollm2-135m-instruct\n")
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(40)], "question": [f"Who wrote book {i}?" for i in range(40)],
                             "label": ["know" if i % 3 == 0 else "unknown" for i in range(40)]}),
                   labels / "labels" / "self_knowledge.parquet")
    out = tmp_path / "m"
    out.mkdir()
    (out / "card.json").write_text("{}")
    (out / "pairs.parquet").write_bytes(b"mined elsewhere")
    card = train_know(KnowTraining(labels=str(labels), output=str(out), held_out=0.0), log=lambda *a: None)
    assert card["labels_generator"] == "smollm2-135m-instruct"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "card.json", "know.json", "pairs.parquet"]
    assert (out / "pairs.parquet").read_bytes() == b"mined elsewhere"
    assert json.loads((out / "card.json").read_text())["labels_generator"] == "smollm2-135m-instruct"


def test_a_run_whose_m_know_learned_another_generators_answers_says_so(tmp_path, monkeypatch):
    """M_know trained on SmolLM2's labels judged for Qwen without a word: it predicts SmolLM2's closed-book answers."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    import jobs.answer
    from strategies.registry import AnswerConfig

    know = tmp_path / "m_know"
    know.mkdir()
    (know / "card.json").write_text(json.dumps({"labels_generator": "smollm2-135m-instruct"}))
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), tmp_path / "q.parquet")
    monkeypatch.setattr(jobs.answer, "_answer", lambda *args: {})
    for generator, warned in (("qwen2.5-coder-0.5b-instruct", True), ("smollm2-135m-instruct", False)):
        config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / f"out-{generator}"),
                              strategies=["raisf"], generator={"model": generator}, know={"model": str(know)},
                              raisf={"know_judge": "trained"})
        said = []
        jobs.answer.answer(config, log=said.append, stages={})
        assert any("learned the closed-book answers of smollm2-135m-instruct" in line for line in said) is warned


def test_mined_pairs_follow_each_questions_gold_order_so_a_seed_mines_the_same_pairs_in_any_process(monkeypatch):
    """The gold passages were walked as a set, in the process's string-hash order, and each pair draws from the
    seeded generator: the same command and seed mined other pairs in another process (76 of 521 differed)."""
    import actors.bm25
    import actors.encoder
    import actors.retriever
    import jobs.index
    import jobs.label
    import jobs.models
    from jobs.relevance_pairs import mine_pairs
    from schemas.records import Passage

    class Stub:
        def __init__(self, *args):
            pass

        def encode(self, texts, role=None):
            return texts

        def search(self, queries, depth):
            return [[] for _ in queries]

    for module, name in ((actors.encoder, "Encoder"), (actors.retriever, "ShardRetriever"), (actors.bm25, "BM25Shard")):
        monkeypatch.setattr(module, name, Stub)
    monkeypatch.setattr(actors.retriever, "merge_topk", lambda results, depth: results[0])
    monkeypatch.setattr(jobs.index, "read_manifest", lambda index_dir: {"embedder": "e", "shards": [{"dir": "s"}]})
    monkeypatch.setattr(jobs.models, "resolve", lambda name: name)
    monkeypatch.setattr(jobs.label, "passages_by_id",
                        lambda index_dir, ids: {i: Passage(i, f"T{i}", f"text {i}", 0.0) for i in ids})
    for order in (["p1", "p2", "p3"], ["p3", "p2", "p1"]):
        pairs = mine_pairs([{"id": "a", "question": "Who?", "gold_passage_ids": order}], "idx", negatives=0)
        assert [p["passage"].rsplit(" ", 1)[-1] for p in pairs] == order


def test_pairs_are_not_mined_from_an_index_of_split_passages(monkeypatch):
    """Its positives would be the gold passages' texts, which such an index holds only in parts (none of
    which need hold the answer): refused, naming what to mine from."""
    import jobs.index
    from jobs.relevance_pairs import mine_pairs
    from schemas.errors import UserError

    monkeypatch.setattr(jobs.index, "read_manifest", lambda index_dir: {
        "embedder": "e", "shards": [{"dir": "s"}], "chunks": {"words": 100, "overlap": 0, "split": 3}})
    with pytest.raises(UserError, match=r"idx holds passages split into parts \(index.chunk_words\)"):
        mine_pairs([{"id": "a", "question": "Who?", "gold_passage_ids": ["p1"]}], "idx", negatives=0)


def test_a_tilde_in_a_training_path_is_the_home_folder(tmp_path, monkeypatch):
    """`output: ~/m_rel` in a train config wrote the model into a folder named "~" under the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    mining = settings(parse(["relevance", "--set", "questions=~/q.parquet", "--set", "index_dir=~/idx",
                             "--output", "~/pairs", "--mine-only", "--set", "exclude=[~/a.txt]", "--exclude", "~/b.txt"]))
    assert (mining.questions, mining.index_dir, mining.output) == tuple(str(tmp_path / n) for n in ("q.parquet", "idx", "pairs"))
    assert mining.exclude == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert settings(parse(["relevance", "--pairs", "~/p.parquet", "--output", "m"])).pairs == str(tmp_path / "p.parquet")
    know = settings(parse(["know", "--set", "labels=~/labels", "--set", "output=~/m_know", "--set", "exclude=[~/c.txt]"]))
    assert (know.labels, know.output, know.exclude) == (str(tmp_path / "labels"), str(tmp_path / "m_know"),
                                                        [str(tmp_path / "c.txt")])
