"""The notebook API: input conversion and column mapping, and one real run over a DataFrame."""

import json

import pandas as pd
import pyarrow as pa
import pytest

from jobs.api import answer_table, to_arrow
from schemas.errors import UserError
from tests.conftest import IN_BATCH


def test_inputs_of_every_kind_become_one_arrow_table_with_our_names():
    import datasets

    rows = [{"qid": "a", "query": "Who?", "golds": ["x"]}, {"qid": "b", "query": "What?", "golds": ["y"]}]
    mapping = {"id": "qid", "question": "query", "answers": "golds"}
    expected = pa.table({"id": ["a", "b"], "question": ["Who?", "What?"], "answers": [["x"], ["y"]]})
    for source in (pd.DataFrame(rows), pa.Table.from_pylist(rows), rows, datasets.Dataset.from_list(rows)):
        assert to_arrow(source, mapping).select(["id", "question", "answers"]).to_pylist() == expected.to_pylist()
    # a filtered Dataset gives the rows it shows; row numbers become ids when there is no id column
    filtered = datasets.Dataset.from_list(rows).filter(lambda r: r["qid"] == "b")
    assert to_arrow(filtered, {"question": "query"}).select(["question", "id"]).to_pylist() == [{"question": "What?", "id": "0"}]


def test_text_held_as_a_categorical_or_dictionary_is_read_as_its_values_and_list_type_clashes_are_clear():
    df = pd.DataFrame({"id": ["a", "b"], "question": ["Who?", "Where?"], "dataset": pd.Categorical(["nq", "nq"])})
    from jobs.api import check_questions

    table = to_arrow(df)
    check_questions(table)  # a SchemaError "expected string/binary" before
    assert table["dataset"].to_pylist() == ["nq", "nq"]
    encoded = to_arrow(pa.table({"question": pa.array(["Who?", "Who?"]).dictionary_encode()}))
    check_questions(encoded)
    assert encoded["question"].to_pylist() == ["Who?", "Who?"]
    with pytest.raises(UserError, match="do not make one table"):  # a bare ArrowTypeError naming nothing
        to_arrow([{"question": "Who?"}, {"question": 3}])


def test_a_lone_surrogate_in_a_list_of_dicts_is_a_one_line_error_naming_its_row_and_key():
    """A bare UnicodeEncodeError from Arrow, naming neither (a JSON Lines file's or a CSV's is refused or that
    row's error: it cannot reach Python as a lone surrogate)."""
    with pytest.raises(UserError, match=r"row 1's 'question' is not valid Unicode \(surrogates not allowed: '\\ud800'\)"):
        to_arrow([{"id": "a", "question": "Who?"}, {"id": "b", "question": "What is \ud800?"}])


def test_a_datasetdict_is_refused_naming_a_split():
    import datasets

    splits = datasets.DatasetDict({"validation": datasets.Dataset.from_dict({"question": ["Who?"]})})
    with pytest.raises(UserError, match=r"pass one split \(ds\['validation'\]\)"):  # an AttributeError before
        to_arrow(splits)


def test_a_sessions_overrides_may_be_one_string():
    from jobs.api import Session

    assert Session(overrides="retrieval.k=3").config.retrieval.k == 3  # read letter by letter before


def test_bad_inputs_are_clear_errors():
    with pytest.raises(UserError, match=r"\['query'\] are not in the questions"):
        to_arrow(pa.table({"question": ["q"]}), {"question": "query"})
    with pytest.raises(TypeError, match="pandas DataFrame, Arrow table"):
        to_arrow("questions.parquet")


@pytest.mark.model
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_answer_table_runs_the_answer_job_on_a_dataframe(tmp_path):
    df = pd.DataFrame({"query": ["What is the capital of France?", "Who wrote Hamlet?", "What is the capital of France?"]})
    out = answer_table(df, "direct", columns={"question": "query"}, output=str(tmp_path / "run"),
                       overrides=["generator.model=smollm2-135m-instruct", "generator.cpu_kvcache_gib=1",
                                  IN_BATCH])
    assert isinstance(out, pd.DataFrame)
    assert sorted(out["id"]) == ["0", "1", "2"] and set(out["strategy"]) == {"direct"}
    assert out["error"].isna().all() and (out["answer"].str.len() > 0).all()
    assert (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.model
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_session_keeps_its_pools_warm_across_calls(tmp_path):
    import ray

    from jobs.api import Session

    was_running = ray.is_initialized()  # another test's Ray, in a whole-suite run
    with Session(generator="smollm2-135m-instruct",
                 overrides=["generator.cpu_kvcache_gib=1", IN_BATCH]) as session:
        first = session.answer(pa.table({"id": ["a", "b"], "question": ["Who wrote Hamlet?", "What is 2 + 2?"]}),
                               "direct", output=str(tmp_path / "one"))
        actors = [a._actor_id for a in session.actors()]
        second = session.answer([{"q": "What is the capital of France?"}], ["direct"], columns={"question": "q"},
                                output=str(tmp_path / "two"))
        assert [a._actor_id for a in session.actors()] == actors and len(actors) == 1  # the same vLLM replica
        replica = session.actors()[0]
        assert ray.get(replica.__ray_ready__.remote())
        assert first.num_rows == 2 and second.num_rows == 1 and second["error"].to_pylist() == [None]
        calls = [json.loads((tmp_path / run / "metrics.json").read_text())["stages"]["generator"]["requests"]
                 for run in ("one", "two")]
        assert calls == [2, 1]  # each call's metrics count its own requests
    assert ray.is_initialized() == was_running  # a Session stops the Ray it started, and only that one
    if was_running:  # and its pools are gone
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(replica.__ray_ready__.remote(), timeout=60)


@pytest.mark.ray
def test_closing_a_session_on_a_ray_it_did_not_start_returns_once_its_pools_are_gone(ray_session):
    from types import SimpleNamespace

    from jobs.api import Session, ray_connection

    ray = ray_session

    @ray.remote(num_cpus=0)
    class Replica:
        pass

    # ray.kill only asks the GCS; without waiting, about one round in three had a killed replica answer
    for _ in range(3):
        session = Session(generator="smollm2-135m-instruct")
        replicas = [Replica.remote() for _ in range(8)]
        ray.get([r.__ray_ready__.remote() for r in replicas])
        session.stages, session.ray = {"generator": SimpleNamespace(replicas=replicas)}, ray_connection()
        session.close()
        calls = [r.__ray_ready__.remote() for r in replicas]
        for call in calls:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(call, timeout=60)
    assert ray.is_initialized()


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_session_returns_rows_in_input_order_and_an_output_it_keeps_is_resumed_never_discarded(ray_session, tmp_path):
    from engine.cache import RequestCache
    from engine.stages import GeneratorStage
    from jobs.api import Session, ray_connection
    from schemas.config import ConfigError, StageBatching
    from tests.engine.fakes import FakeGenerator

    session = Session(generator="smollm2-135m-instruct")
    actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    session.stages, session.ray = {"generator": GeneratorStage([actor], StageBatching(max_batch=2))}, ray_connection()
    session.cache = RequestCache(100)
    questions = pd.DataFrame({"id": ["q3", "q1", "q10", "q2", "q0"], "question": [f"question {i}" for i in range(5)]})
    out = str(tmp_path / "kept")
    first = session.answer(questions, "direct", output=out)
    assert first["id"].tolist() == ["q3", "q1", "q10", "q2", "q0"]  # before: in the order they finished
    first.to_parquet(tmp_path / "saved.parquet")  # step_tokens as pairs: an ArrowTypeError before
    kept = {p: p.read_bytes() for p in sorted((tmp_path / "kept" / "direct").rglob("*")) if p.is_file()}
    both = session.answer(questions, ["least_to_most", "direct"], output=out)  # before: force discarded direct's
    assert both["strategy"].tolist() == ["least_to_most"] * 5 + ["direct"] * 5
    assert both[both["strategy"] == "direct"]["answer"].tolist() == first["answer"].tolist()
    # resumed, not recomputed: this call answered only least_to_most's 5 questions, and direct's parts are untouched
    assert json.loads((tmp_path / "kept" / "metrics.json").read_text())["roots_done"] == 5
    assert kept and {p: p.read_bytes() for p in sorted((tmp_path / "kept" / "direct").rglob("*")) if p.is_file()} == kept
    inputs = sorted((tmp_path / "kept" / "_input").iterdir())
    # it named the CLI's --output / --force, and wrote the refused questions beside the run's first
    with pytest.raises(ConfigError, match=r"holds output of a different run .*pass another output=, or remove"):
        session.answer(questions.head(2), "direct", output=out)
    assert sorted((tmp_path / "kept" / "_input").iterdir()) == inputs
    assert len(session.answer(questions, "direct", output=out)) == 5  # the earlier answers are still there


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_dataframe_whose_rows_all_errored_is_written_back_to_parquet(ray_session, tmp_path):
    """Every row an error: step_tokens was {} in each, which pandas stores as a struct without fields, and
    to_parquet raised ArrowNotImplementedError."""
    from engine.cache import RequestCache
    from engine.stages import GeneratorStage
    from jobs.api import Session, ray_connection
    from schemas.config import StageBatching
    from tests.engine.fakes import BadReplicaGenerator

    session = Session(generator="smollm2-135m-instruct")
    broken = ray_session.remote(BadReplicaGenerator).options(num_cpus=0).remote(True)
    session.stages, session.ray = {"generator": GeneratorStage([broken], StageBatching())}, ray_connection()
    session.cache = RequestCache(100)
    answers = session.answer(pd.DataFrame({"id": ["a", "b"], "question": ["Who?", "What?"]}), "direct")
    assert answers["error"].str.contains("device lost").all()
    answers.to_parquet(tmp_path / "errors.parquet")
    assert pd.read_parquet(tmp_path / "errors.parquet")["step_tokens"].isna().all()


def test_a_dataframes_step_tokens_are_a_dict_a_row_and_none_for_a_row_without_steps(tmp_path):
    import pyarrow.parquet as pq

    from jobs.api import as_dataframe
    from schemas.tables import ANSWERS

    steps = pa.array([[("answer", 7)], [], [("plan", 3), ("answer", 5)]], ANSWERS.field("step_tokens").type)
    frame = as_dataframe(pa.table({"id": ["a", "b", "c"], "step_tokens": steps}))
    assert frame["step_tokens"].tolist() == [{"answer": 7}, None, {"plan": 3, "answer": 5}]
    frame.to_parquet(tmp_path / "answers.parquet")
    assert pq.read_table(tmp_path / "answers.parquet")["step_tokens"].to_pylist() == [
        {"answer": 7, "plan": None}, None, {"answer": 5, "plan": 3}]


def test_answers_come_back_in_the_input_order_with_a_null_id_at_its_row_and_only_the_strategies_asked():
    from jobs.api import in_input_order

    questions = pa.table({"id": ["b", "a", "b", None, "c"], "question": list("vwxyz")})
    answers = pa.table({"id": ["c", "<row 3>", "a", "b", "c", "b"], "strategy": ["rag"] * 4 + ["direct", "raisf"]})
    ordered = in_input_order(answers, questions, ["raisf", "rag"])
    assert list(zip(ordered["strategy"].to_pylist(), ordered["id"].to_pylist())) == [
        ("raisf", "b"), ("rag", "b"), ("rag", "a"), ("rag", "<row 3>"), ("rag", "c")]


def test_integer_ids_of_a_dataframe_become_text_in_their_order():
    """A DataFrame's int ids were refused, naming a temporary file the user never wrote."""
    table = to_arrow(pd.DataFrame({"id": [3, 1, 2], "question": ["a?", "b?", "c?"]}))
    assert table["id"].to_pylist() == ["3", "1", "2"]


def test_a_session_asked_for_an_unknown_strategy_says_which_exist(tmp_path):
    """model_copy skipped the validators: a bare KeyError 'nonexistent', and [] ran an empty job."""
    from jobs.api import Session

    session = Session(generator="smollm2-135m-instruct")
    for strategies in ("nonexistent", []):
        with pytest.raises(UserError, match="unknown strategy .* choose from"):
            session.answer(pd.DataFrame({"id": ["a"], "question": ["Who?"]}), strategies, output=str(tmp_path / "o"))


def test_a_session_refuses_questions_without_a_question_column_or_rows_before_anything_starts(monkeypatch):
    from jobs.api import Session

    session = Session(generator="smollm2-135m-instruct")
    monkeypatch.setattr(session, "_start", lambda config: pytest.fail("Ray and the pools started"))
    with pytest.raises(UserError, match="no questions to answer"):
        session.answer([], "direct")
    with pytest.raises(UserError, match=r"question.*columns=\{'question': '<yours>'"):
        session.answer([{"query": "What?"}], "direct")


def test_a_later_call_whose_pools_a_sessions_own_ray_cannot_place_is_refused_not_left_waiting():
    from jobs.api import unplaceable

    unplaceable({"encoder": None}, (1.0, {}), {"CPU": 1.0})  # fits
    with pytest.raises(UserError, match=r"cannot place the pools \['encoder', 'shards'\].*retrieval 1, 0 free"):
        unplaceable({"encoder": None, "shards": None}, (0.5, {"retrieval": 1.0}), {"CPU": 2.0})
    with pytest.raises(UserError, match="GPU 1, 0 free"):  # a GPU pool on a CPU-only local Ray
        unplaceable({"generator": None}, (1.0, {"GPU": 1.0}), {"CPU": 2.0})
    unplaceable({"encoder": None}, (0.5, {"GPU": 0.0}), {"CPU": 2.0})  # asks for no GPU: fits


@pytest.mark.ray
def test_a_later_call_that_needs_the_ranker_ranks_on_the_sessions_running_encoders(ray_session):
    """rag, then think_act: the ranker's fallback is the encoder pool, which the retriever already runs.
    A second encoder was started (13 s here), or the call refused on a small box ("CPU 0.5, 0 free")."""
    from engine.stages import GeneratorStage, RetrieverStage
    from jobs.api import Session, ray_connection
    from schemas.config import StageBatching, validated
    from tests.engine.fakes import FakeEncoder, FakeGenerator

    session = Session()
    generator = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    encoders = [ray_session.remote(FakeEncoder).options(num_cpus=0).remote()]
    session.stages = {"generator": GeneratorStage([generator], StageBatching()),
                      "retriever": RetrieverStage(encoders, [], StageBatching())}
    session.ray = ray_connection()
    config = validated(type(session.config), {**session.config.model_dump(), "strategies": ["think_act"]})
    session._start(config)
    assert session.stages["ranker"].replicas == encoders and set(session.stages) == {"generator", "retriever", "ranker"}


def test_a_session_on_the_ray_another_session_started_is_refused_pools_it_cannot_place_not_left_waiting(monkeypatch):
    """A second Session while the first, which started Ray for its own pools, was open: its call waited for
    ever, without a word (the check ran only for the Session that started Ray)."""
    from types import SimpleNamespace

    import ray

    import jobs.api
    import jobs.pools
    from jobs.api import Session, ray_connection
    from schemas.config import validated

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "the first Session's",
                                                                           get_job_id=lambda: "01000000"))
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.0})
    monkeypatch.setattr(jobs.api, "FREED_WITHIN_S", 0.0)
    monkeypatch.setattr(jobs.pools, "build_stages", lambda *args: pytest.fail("pools started that cannot be placed"))
    monkeypatch.setattr(jobs.api, "SESSIONS_RAY", {ray_connection()})
    second = Session(generator="smollm2-135m-instruct")
    config = validated(type(second.config), {**second.config.model_dump(), "strategies": ["direct"]})
    refused = r"another Session of this process started Ray .*\['generator'\].*use that Session .* or close it"
    with pytest.raises(UserError, match=refused):
        second._start(config)
    monkeypatch.setattr(jobs.api, "SESSIONS_RAY", set())  # the user's own Ray: Ray's to place, as before
    monkeypatch.setattr(jobs.pools, "build_stages", lambda config, needs, plan, running: {"generator": "a pool"})
    second._start(config)
    assert second.stages == {"generator": "a pool"}


def test_gpu_reservations_no_device_can_hold_beside_the_sessions_pools_are_refused_though_their_sum_fits():
    """0.6 + 0.6 held on two devices leaves 0.4 on each: 0.8 GPU free, and no room for a third 0.6."""
    from jobs.api import no_device

    no_device({"judge": None}, [0.6], (0.6,), 2.0)  # on the other device
    no_device({"judge": None}, [1.0], (0.5, 0.5), 2.0)  # both on the free device
    no_device({"encoder": None}, [0.6, 0.6], (), 2.0)  # asks for no GPU
    with pytest.raises(UserError, match=r"cannot place the pools \['judge'\].*1 x 0.6 beside the 2 x 0.6 held there need "
                                        r"3 devices and it has 2.*name every strategy in its first call"):
        no_device({"judge": None}, [0.6, 0.6], (0.6,), 2.0)
    with pytest.raises(UserError, match=r"1 x 0.5 beside the none held there need 1 device and it has 0"):
        no_device({"nli": None}, [], (0.5,), 0.0)


def test_a_later_call_whose_gpu_pool_fits_the_free_sum_but_no_device_is_refused_not_left_waiting(monkeypatch):
    """A first Session's pools hold 0.6 GPU on each of two devices; a second asks for a 0.6 generator. Ray
    reported 0.8 GPU free, the sum check passed, and the replica waited for ever on a Ray no call could widen."""
    from types import SimpleNamespace

    import ray

    import jobs.api
    import jobs.pools
    from jobs.api import Session, ray_connection
    from schemas.config import validated

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "the first Session's",
                                                                           get_job_id=lambda: "01000000"))
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 8.0, "GPU": 0.8})
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    monkeypatch.setattr(jobs.api, "FREED_WITHIN_S", 0.0)
    monkeypatch.setattr(jobs.api, "SESSIONS_RAY", {ray_connection()})
    first = Session()
    first.ray, first.gpus = ray_connection(), [0.6, 0.6]  # on the Ray a Session of this process started
    second = Session(generator="smollm2-135m-instruct", overrides=["generator.num_gpus=0.6"])
    config = validated(type(second.config), {**second.config.model_dump(), "strategies": ["direct"]})
    monkeypatch.setattr(jobs.pools, "build_stages", lambda *args: pytest.fail("a pool started that cannot be placed"))
    with pytest.raises(UserError, match=r"another Session .*\['generator'\].*1 x 0.6 beside the 2 x 0.6 held there"):
        second._start(config)
    first.close()  # its pools are gone (it holds no actor to stop here): their devices are free again
    monkeypatch.setattr(jobs.pools, "build_stages", lambda config, needs, plan, running: {"generator": "a pool"})
    second._start(config)
    assert second.stages == {"generator": "a pool"} and second.gpus == [0.6]


def test_a_session_whose_ray_was_shut_down_under_it_starts_its_pools_again(monkeypatch):
    """Another Session's close() shut down the Ray both used: every later row was an error ("Can't find
    actor"), and Ray's auto-init started a bare local Ray with none of ragsift's settings."""
    import ray

    import jobs.pools
    import jobs.ray_session
    from jobs.api import Session
    from schemas.config import validated

    session = Session(generator="smollm2-135m-instruct")
    session.stages, session.cache = {"generator": "a pool of the Ray that is gone"}, object()
    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *args: started.append("ray"))
    monkeypatch.setattr(jobs.pools, "build_stages", lambda config, needs, plan, running: {"generator": "a new pool"})
    session._start(validated(type(session.config), {**session.config.model_dump(), "strategies": ["direct"]}))
    assert session.stages == {"generator": "a new pool"} and started == ["ray"] and session.started_ray


def test_a_session_whose_ray_was_replaced_under_it_starts_its_pools_on_the_new_one_and_leaves_that_ray_at_close(
        monkeypatch):
    """ray.shutdown() then ray.init() by the user: the Session kept the gone Ray's pools, every later row was an
    error ("Can't find actor"), and close() raised ActorHandleNotFoundError on their handles."""
    from types import SimpleNamespace

    import ray

    import jobs.pools
    import jobs.ray_session
    from jobs.api import Session
    from schemas.config import validated

    now = {"node": "the first Ray"}  # a new local Ray is another node; its job ids start again at 01000000
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: now["node"],
                                                                           get_job_id=lambda: "01000000"))
    monkeypatch.setattr(jobs.pools, "build_stages", lambda config, needs, plan, running: {"generator": f"on {now['node']}"})
    started, stopped = [], []
    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *args: started.append("ray"))
    monkeypatch.setattr(ray, "kill", stopped.append)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append("ray"))
    session = Session(generator="smollm2-135m-instruct")
    config = validated(type(session.config), {**session.config.model_dump(), "strategies": ["direct"]})
    session._start(config)
    assert session.stages == {"generator": "on the first Ray"}
    now["node"] = "the user's new Ray"
    session._start(config)
    assert session.stages == {"generator": "on the user's new Ray"} and started == [] and not session.started_ray
    now["node"] = "another Ray again"
    session.close()  # its pools went with their Ray; the Ray there is now is not this Session's to stop
    assert stopped == [] and session.stages == {}


def test_a_session_whose_first_pools_failed_on_its_own_ray_leaves_the_users_ray_that_replaced_it(monkeypatch):
    """It started a Ray, its pools failed to start, the user replaced that Ray: the next call built pools on the
    user's Ray, but the Session still counted the Ray as its own and close() shut the user's down."""
    from types import SimpleNamespace

    import ray

    import jobs.api
    import jobs.pools
    import jobs.ray_session
    from jobs.api import Session
    from schemas.config import validated

    now = {"node": None}

    def init_ray(*args):
        now["node"] = "the Session's Ray"

    def build_stages(config, needs, plan, running):
        if now["node"] == "the Session's Ray":
            raise RuntimeError("a pool failed to start")
        return {"generator": SimpleNamespace(replicas=[f"a replica on {now['node']}"])}

    monkeypatch.setattr(ray, "is_initialized", lambda: now["node"] is not None)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: now["node"],
                                                                           get_job_id=lambda: "01000000"))
    monkeypatch.setattr(jobs.ray_session, "init_ray", init_ray)
    monkeypatch.setattr(jobs.pools, "build_stages", build_stages)
    stopped = []
    monkeypatch.setattr(ray, "kill", stopped.append)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append("ray"))
    session = Session(generator="smollm2-135m-instruct")
    config = validated(type(session.config), {**session.config.model_dump(), "strategies": ["direct"]})
    with pytest.raises(RuntimeError, match="a pool failed"):
        session._start(config)
    assert session.started_ray
    now["node"] = "the user's Ray"  # ray.shutdown(); ray.init() by the user
    session._start(config)
    assert session.actors() == ["a replica on the user's Ray"] and not session.started_ray
    monkeypatch.setattr(jobs.api, "wait_until_dead", lambda actors, wait_s: None)
    session.close()
    assert stopped == ["a replica on the user's Ray"]  # its pools, not the Ray


def test_a_sessions_close_waits_wait_s_in_all_not_for_the_engines_and_again_for_the_actors(monkeypatch):
    from types import SimpleNamespace

    import ray

    import jobs.api
    import jobs.pools
    from jobs.api import Session

    clock = [100.0]
    monkeypatch.setattr(jobs.api.time, "monotonic", lambda: clock[0])
    waited = []

    def stop(stages, wait_s):  # the engines took 25 s to stop
        waited.append(("engines", wait_s))
        clock[0] += 25.0

    monkeypatch.setattr(jobs.pools, "stop_llm_engines", stop)
    monkeypatch.setattr(jobs.api, "wait_until_dead", lambda actors, wait_s: waited.append(("actors", wait_s)))
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    session = Session(generator="smollm2-135m-instruct")
    session.stages = {"generator": SimpleNamespace(replicas=["r"])}
    monkeypatch.setattr(session, "_on_its_ray", lambda: True)
    session.close(wait_s=30.0)
    assert waited == [("engines", 30.0), ("actors", 5.0)]


def test_a_sessions_close_interrupted_while_its_engines_stop_still_kills_its_actors_and_its_ray(monkeypatch):
    """A Ctrl-C in the engines' wait (up to 60 s) skipped the kills and ray.shutdown: the actors, their GPUs
    and the Ray the Session started stayed up in the notebook, and its next Session reused that Ray."""
    from types import SimpleNamespace

    import ray

    import jobs.pools
    from jobs.api import Session

    def interrupted(stages, wait_s):
        raise KeyboardInterrupt

    done = []
    monkeypatch.setattr(jobs.pools, "stop_llm_engines", interrupted)
    monkeypatch.setattr(ray, "kill", lambda actor: done.append(("kill", actor)))
    monkeypatch.setattr(ray, "shutdown", lambda: done.append("shutdown"))
    session = Session(generator="smollm2-135m-instruct")
    session.stages, session.started_ray = {"generator": SimpleNamespace(replicas=["r"])}, True
    monkeypatch.setattr(session, "_on_its_ray", lambda: True)
    with pytest.raises(KeyboardInterrupt):
        session.close()
    assert done == [("kill", "r"), "shutdown"]
    assert session.stages == {} and not session.started_ray


def test_a_sessions_close_interrupted_on_a_ray_it_did_not_start_still_frees_its_placement_groups(monkeypatch):
    """A Ctrl-C while the actors died skipped remove_placement_group, and close forgot the stages: the
    devices those groups reserved stayed reserved for the rest of the process."""
    from types import SimpleNamespace

    import ray

    import jobs.api
    import jobs.pools
    from jobs.api import Session

    def interrupted(actors, wait_s):
        raise KeyboardInterrupt

    removed = []
    monkeypatch.setattr(jobs.pools, "stop_llm_engines", lambda stages, wait_s: None)
    monkeypatch.setattr(jobs.api, "wait_until_dead", interrupted)
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    monkeypatch.setattr(ray.util, "remove_placement_group", removed.append)
    session = Session(generator="smollm2-135m-instruct")
    session.stages = {"generator": SimpleNamespace(replicas=["r"], placement_groups=["group"])}
    monkeypatch.setattr(session, "_on_its_ray", lambda: True)
    with pytest.raises(KeyboardInterrupt):
        session.close()
    assert removed == ["group"] and session.stages == {}
