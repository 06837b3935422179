"""What an endpoint replica makes of responses a real server may send, without a server or with a stub
one: judgments outside the choices, responses of another shape, and refusals that are the settings'."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from actors.endpoint_generator import EndpointGenerator
from schemas.config import EndpointConfig, LLMConfig, SamplingConfig
from schemas.records import Generate, Judge


def chat(text: str) -> tuple:
    return (("user", text),)


def response(content, top=None, usage=SimpleNamespace(prompt_tokens=9, completion_tokens=1)):
    logprobs = (SimpleNamespace(content=[SimpleNamespace(top_logprobs=[SimpleNamespace(token=t, logprob=lp)
                                                                      for t, lp in top])]) if top else None)
    return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content), finish_reason="stop",
                                                    logprobs=logprobs)], usage=usage)


def test_a_judgment_without_guided_choice_is_the_choice_it_names_or_an_error_never_a_no():
    judge = Judge(chat("Is Paris in France?"))
    # vllm_extensions: false, no log-probs: "Yes" was label "Yes", so P(yes) 0
    said_yes = EndpointGenerator.result(judge, response("Yes."))
    assert (said_yes.label, said_yes.prob("yes"), said_yes.error) == ("yes", 1.0, None)
    unclear = EndpointGenerator.result(judge, response("maybe"))
    assert unclear.error and "none of ['yes', 'no']" in unclear.error
    # log-probs decide P; a label outside the choices becomes the likelier choice
    scored = EndpointGenerator.result(judge, response("Certainly", top=[("Yes", -0.1), ("No", -2.5)]))
    assert scored.label == "yes" and scored.prob("yes") > 0.9 and not scored.error
    assessed = EndpointGenerator.result(Judge(chat("Q"), ("CLEAR AND COMPLETE", "INCOMPLETE", "AMBIGUOUS")),
                                        response("Incomplete"))
    assert assessed.label == "INCOMPLETE"


def test_a_200_of_another_shape_is_that_requests_error_and_missing_token_counts_are_zero():
    empty = SimpleNamespace(choices=[], usage=None)
    for request in (Generate(chat("Q")), Judge(chat("Q"))):
        result = EndpointGenerator.result(request, empty)  # an IndexError failed the whole call before
        assert result.error and "another shape" in result.error
    counted = EndpointGenerator.result(Generate(chat("Q")), response("Paris", usage=SimpleNamespace(
        prompt_tokens=None, completion_tokens=None)))
    assert (counted.text, counted.prompt_tokens, counted.completion_tokens) == ("Paris", 0, 0)
    # a log-prob of 1000 (no model gives one > 0) overflowed exp() and failed the call, its neighbours too
    wild = EndpointGenerator.result(Judge(chat("Q")), response("maybe", top=[("yes", 1000.0)]))
    assert wild.error and "another shape" in wild.error


def reply(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
    """Read the request, answer ``payload`` as JSON with ``status``."""
    handler.rfile.read(int(handler.headers["Content-Length"]))
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class Refusing(BaseHTTPRequestHandler):
    status = 401

    def do_POST(self):
        reply(self, self.status, b'{"error": {"message": "refused"}}')

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    llm = LLMConfig(model="served", endpoint=EndpointConfig(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                                                           max_retries=0))
    yield llm.model_dump(), SamplingConfig().model_dump()
    server.shutdown()


class Dropping(BaseHTTPRequestHandler):
    """Sends a 200's headers and part of its body, then closes the connection (a server or proxy that died)."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "500")
        self.end_headers()
        self.wfile.write(b'{"id": "x", "choi')

    def log_message(self, *args):
        pass


def test_a_connection_dropped_mid_response_is_a_connection_error_not_a_200_and_fails_the_call():
    """http_status counted each dropped response as a 200 (its headers had come), while the client retried it."""
    from actors.endpoint_generator import EndpointError

    server = ThreadingHTTPServer(("127.0.0.1", 0), Dropping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        llm = LLMConfig(model="served", endpoint=EndpointConfig(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", max_retries=1))
        replica = EndpointGenerator(llm.model_dump(), SamplingConfig().model_dump())
        with pytest.raises(EndpointError, match="APIConnectionError") as raised:
            asyncio.run(replica.generate([Generate(chat("Q"))]))  # the engine retries it, as a lost connection
    finally:
        server.shutdown()
    assert raised.value.status_code is None
    assert replica.engine_stats()["http_status"] == {"connection error": 2}  # the request and its retry


class Answering(BaseHTTPRequestHandler):
    """Answers every chat completion "Paris"; a GET waits for ``release``."""

    release, received = threading.Event(), threading.Event()

    def do_GET(self):
        self.received.set()
        self.release.wait(30)

    def do_POST(self):
        reply(self, 200, json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "served", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}]}).encode())

    def log_message(self, *args):
        pass


def test_a_replica_whose_connection_pool_leaked_gets_a_new_client_instead_of_timing_out_for_good(monkeypatch):
    """Requests cancelled while the pool assigned them a connection leak it (httpcore#1093): after a 503 storm
    every slot was taken, each request timed out waiting for one, after the server was well again too, until
    the watchdog restarted the replica 1,800 s later."""
    import actors.endpoint_generator
    from actors.endpoint_generator import EndpointError

    monkeypatch.setattr(actors.endpoint_generator, "POOL_TIMEOUT_S", 0.2)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    replica = EndpointGenerator(LLMConfig(model="served", endpoint=EndpointConfig(
        base_url=url, max_concurrency=1, max_retries=0, timeout_s=3)).model_dump(), SamplingConfig().model_dump())

    async def leaked_then_asked():
        # the pool's only connection taken for good, as a leaked one is
        leaked = replica.client
        held = asyncio.create_task(leaked.get("/hang", cast_to=object))
        assert await asyncio.to_thread(Answering.received.wait, 30)  # the server has it: the connection is taken
        with pytest.raises(EndpointError, match="APITimeoutError"):  # in 0.2 s, not timeout_s
            await replica.generate([Generate(chat("Q"))])
        open_then = not leaked.is_closed()
        answered = await replica.generate([Generate(chat("Q"))])
        while not leaked.is_closed():  # the old client's requests have had timeout_s to end: it is closed
            await asyncio.sleep(0.05)
        held.cancel()
        return answered, open_then

    try:
        (answered,), open_then = asyncio.run(asyncio.wait_for(leaked_then_asked(), 60))  # closed, not never
    finally:
        Answering.release.set()
        server.shutdown()
    assert answered.text == "Paris" and not answered.error
    assert replica.engine_stats()["new_clients"] == 1
    assert open_then  # not at once: its live requests finish on it


@pytest.mark.parametrize("status", [401, 403, 404, 503])
def test_a_refused_key_or_model_name_fails_the_call_instead_of_making_every_row_an_error(status, refusing):
    import pickle

    from actors.endpoint_generator import EndpointError

    Refusing.status = status
    replica = EndpointGenerator(*refusing)
    with pytest.raises(EndpointError, match=f"openai.*Error code: {status}") as raised:
        asyncio.run(replica.generate([Generate(chat("Q")), Judge(chat("Q"))]))  # the engine then stops the stage
    again = pickle.loads(pickle.dumps(raised.value))  # as Ray carries it to the driver
    assert str(again) == str(raised.value) and again.status_code == status


@pytest.mark.ray
def test_a_refusal_reaches_the_driver_through_ray_naming_its_status(refusing, ray_session):
    """The openai client's errors do not pickle: the driver got an UnserializableException, which the
    engine did not count as a call that raised (a wrong key made every row an error, its message a
    cut-off traceback without the 401)."""
    Refusing.status = 401
    replica = ray_session.remote(EndpointGenerator).options(num_cpus=0).remote(*refusing)
    with pytest.raises(ray_session.exceptions.RayTaskError, match="Error code: 401") as raised:
        ray_session.get(replica.generate.remote([Generate(chat("Q"))]), timeout=60)
    assert "Unserializable" not in str(raised.value)


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_run_on_an_endpoint_that_refuses_its_key_stops_naming_the_refusal(refusing, ray_session, tmp_path):
    """README's promise: a 401 / 403 / 404 stops the stage, at once. Before, 20 questions became 20 error rows
    ("UnserializableException: Failed to deserialize exception"), after 150 requests; then, with the error
    readable, a small input still ended as error rows before fail_fast_after's 64 retries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.answer import answer
    from schemas.errors import StageDown
    from strategies.registry import AnswerConfig

    Refusing.status = 401
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(6)], "question": [f"Who is {i}?" for i in range(6)]}),
                   tmp_path / "q.parquet")
    llm, _ = refusing
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"],
                          generator={"model": "served", "endpoint": llm["endpoint"], "num_cpus": 0},
                          engine={"failure_cooldown_s": 0.1}, cache={"enabled": False})
    with pytest.raises(StageDown, match="401"):
        answer(config, log=lambda *_: None)
