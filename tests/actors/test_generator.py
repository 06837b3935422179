import math

import pytest

from actors.generator import choice_probs, completion_budget


def lp(token, p):
    return token, math.log(p)


def test_choice_probs_sums_case_and_space_variants_and_normalises():
    first = [lp("Yes", 0.5), lp(" yes", 0.1), lp("No", 0.2), lp("Maybe", 0.2)]
    probs = choice_probs(first, ("yes", "no"))
    assert probs["yes"] == pytest.approx(0.75) and probs["no"] == pytest.approx(0.25)


def test_choice_prefix_tokens_count_and_no_mass_gives_none():
    probs = choice_probs([lp("AMB", 0.3), lp("CLEAR", 0.6)], ("CLEAR AND COMPLETE", "AMBIGUOUS"))
    assert probs["CLEAR AND COMPLETE"] == pytest.approx(2 / 3)
    assert choice_probs([lp("Paris", 0.9), lp("  ", 0.1)], ("yes", "no")) is None


def test_a_first_token_that_begins_several_choices_is_shared_whatever_their_order():
    """"yes" begins yes and yesterday: all its mass went to whichever was listed first."""
    for choices in (("yes", "yesterday"), ("yesterday", "yes")):
        probs = choice_probs([lp("yes", 0.6), lp("yester", 0.2)], choices)
        assert probs["yes"] == pytest.approx(0.3 / 0.8) and probs["yesterday"] == pytest.approx(0.5 / 0.8)


def test_a_choices_first_token_that_decodes_to_no_text_counts_by_its_id():
    """A byte of 否 decodes to '': P(否) was 0 and P(是) 1.0 whenever 是 was among the top tokens."""
    probs = choice_probs([lp("是", 0.09), lp("", 0.3)], ("是", "否"), fragments=[("否", math.log(0.3))])
    assert probs["否"] == pytest.approx(0.3 / 0.39)


def test_a_judgments_budget_spells_its_longest_choice_letter_by_letter():
    from schemas.records import Judge

    assert Judge((("user", "q"),), ("CLEAR AND COMPLETE", "AMBIGUOUS")).max_tokens == 19
    assert Judge((("user", "q"),), ("是", "否")).max_tokens == 4  # three bytes each


def test_completion_budget_is_cut_to_the_context_left_and_errors_only_without_room():
    assert completion_budget(1000, 384, 2048) == 384
    assert completion_budget(1300, 768, 2048) == 748  # a retry with a doubled budget still runs
    assert completion_budget(2047, 64, 2048) == 1
    assert "leaves 0 of max_model_len 2048" in completion_budget(2100, 64, 2048)
    # the strategies' own k too: raisf.k=30 overflowed under retrieval.k=1 and was told to lower retrieval.k
    assert "read fewer passages (retrieval.k, or the strategy's own k: raisf.k" in completion_budget(2100, 64, 2048)
    assert "needs 3" in completion_budget(2046, 3, 2048, minimum=3)  # a judgment needs its whole choice


@pytest.mark.ray
@pytest.mark.model
@pytest.mark.timeout(600)
def test_an_async_replica_streams_each_result_when_its_sequence_ends_with_the_batch_kinds_answers(ray_session):
    """The real model (SmolLM2) behind both replica kinds: the same requests give the same results, and
    the async kind sends a short result back while a long sequence of the same call still runs."""
    from actors.generator import Generator
    from actors.streaming_generator import StreamingGenerator
    from jobs.pools import llm_settings
    from schemas.config import LLMConfig, SamplingConfig
    from schemas.records import Generate, Judge

    settings = (llm_settings(LLMConfig(model="smollm2-135m-instruct", cpu_kvcache_gib=1)), SamplingConfig().model_dump())
    requests = [Generate((("user", "Count to 6."),), max_tokens=64),  # SmolLM2 goes on past 6
                Judge((("user", "Is the sky blue?"),), ("yes", "no")),
                Generate((("user", "Name a colour."),), max_tokens=3)]
    streaming = ray_session.remote(StreamingGenerator).options(num_cpus=0).remote(*settings)
    assert ray_session.get(streaming.kv_capacity.remote()) > 10_000
    chunks = [ray_session.get(ref) for ref in streaming.stream.options(num_returns="streaming").remote(requests)]
    stats = ray_session.get(streaming.engine_stats.remote())  # vLLM's own figures for metrics.json
    ray_session.kill(streaming)
    assert stats["steps"] >= 32 and stats["ttft_s"]["n"] == 3 and stats["ttft_s"]["p50"] > 0
    assert 0 < stats["kv_cache_usage"]["peak"] <= 1 and stats["preemptions"] == 0 and stats["running_peak"] == 3
    order = [i for chunk in chunks for i, _ in chunk]
    assert sorted(order) == [0, 1, 2] and order[-1] == 0 and len(chunks) >= 2  # the long one came back last, alone
    streamed = dict(pair for chunk in chunks for pair in chunk)
    assert streamed[0].completion_tokens >= 32 and streamed[2].completion_tokens <= 3

    batch = ray_session.remote(Generator).options(num_cpus=0).remote(*settings)
    batched = ray_session.get(batch.generate.remote(requests))
    long = Generate((("user", "Name a colour. " * 60),), max_tokens=2)  # over one 128-token KV block
    first, again = (ray_session.get(batch.generate.remote([long]))[0] for _ in range(2))
    # under guided choice SmolLM2 spells these letter by letter: with the choices' own token counts as the
    # budget the labels came back "AMBIGUO" and "NO RETRI"; a budget of 0 ran the default 48 tokens
    choices = [("CLEAR AND COMPLETE", "INCOMPLETE", "AMBIGUOUS"), ("RETRIEVAL", "NO RETRIEVAL")]
    judged = ray_session.get(batch.generate.remote([
        Judge((("user", "Is 'what is it' a clear question?"),), choices[0]),
        Judge((("user", "Do you need to search the web to answer 'What is 2+2'?"),), choices[1]),
        Generate((("user", "Name a colour."),), max_tokens=0)]))
    ray_session.kill(batch)
    assert [j.label in c for j, c in zip(judged, choices)] == [True, True], [j.label for j in judged[:2]]
    assert judged[2].error and "max_tokens 0" in judged[2].error
    assert first.cached_tokens == 0 and again.cached_tokens >= 128  # the prefix cache's hits are counted
    # same prompts and sampling; log-probs may differ in the last digits with the batch's composition
    assert [streamed[i].text for i in (0, 2)] == [batched[i].text for i in (0, 2)]
    assert streamed[1].label == batched[1].label
    assert streamed[1].probs == pytest.approx(batched[1].probs, abs=0.02)


def test_auto_dtype_is_bfloat16_only_where_the_cpu_computes_it_natively():
    from actors.generator import resolve_dtype

    assert resolve_dtype("auto", "flags : fpu avx2 avx512f avx512_bf16 amx_tile") == "bfloat16"
    assert resolve_dtype("auto", "flags : fpu avx2 amx_bf16 amx_tile") == "bfloat16"
    assert resolve_dtype("auto", "flags : fpu sse4_2 avx2 fma") == "float32"
    assert resolve_dtype("float16", "flags : avx2") == "float16"  # an explicit dtype is kept


def test_a_judgments_result_finds_a_choices_byte_fragment_first_token_by_its_id():
    """How Prompts.result builds the fragments choice_probs reads: the choice's own first token id among
    the first position's top log-probs, decoding to no text."""
    from types import SimpleNamespace as NS

    from actors.generator import Prompts
    from schemas.records import Judge

    class Tokenizer:
        def encode(self, text, add_special_tokens=False):
            return {"是": [11, 12], "否": [21, 22]}[text]

    first = {11: NS(decoded_token="是", logprob=math.log(0.1)), 21: NS(decoded_token="", logprob=math.log(0.3)),
             99: NS(decoded_token="", logprob=math.log(0.5))}  # a fragment of neither choice: not counted
    out = NS(outputs=[NS(text="否", token_ids=[21, 22], logprobs=[first])], prompt_token_ids=[1, 2], num_cached_tokens=0)
    judgment = Prompts(Tokenizer(), 512, {}).result(Judge((("user", "q"),), ("是", "否")), out)
    assert judgment.label == "否" and judgment.probs == pytest.approx({"是": 0.25, "否": 0.75})


class TokenizerFailingOn:
    """Templates every chat but those holding ``word``, for which it raises as a template's raise_exception
    or a tokenizer given a lone surrogate does."""

    def __init__(self, word):
        self.word = word

    def apply_chat_template(self, chat, tokenize, add_generation_prompt):
        if any(self.word in m["content"] for m in chat):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")
        return [1, 2, 3]


def finished(prompt):
    from types import SimpleNamespace as NS

    return NS(outputs=[NS(text=f"answer to {len(prompt['prompt_token_ids'])} tokens", token_ids=[7, 8], logprobs=None,
                          finish_reason="stop")],
              prompt_token_ids=prompt["prompt_token_ids"], num_cached_tokens=0)


def requests_one_bad():
    from schemas.records import Generate, Judge

    return [Generate((("user", "first"),)), Generate((("user", "bad"),)), Judge((("user", "bad?"),)),
            Generate((("user", "last"),))]


def assert_only_the_bad_ones_failed(results):
    from schemas.records import Generation, Judgment

    assert [r.error is None for r in results] == [True, False, False, True]
    assert results[0].text == results[3].text == "answer to 3 tokens"
    assert type(results[1]) is Generation and type(results[2]) is Judgment  # each of its request's kind
    assert "prompt not prepared: TypeError: TextEncodeInput" in results[1].error


def test_a_request_whose_prompt_cannot_be_tokenized_is_its_own_error_and_the_rest_of_a_batch_is_answered():
    """The exception ended the replica's whole call: every request of the batch failed with it."""
    from actors.generator import Generator, Prompts
    from schemas.config import SamplingConfig

    class LLM:
        def generate(self, prompts, params, use_tqdm):
            return [finished(p) for p in prompts]

    replica = object.__new__(Generator)  # its engine a stand-in: the control flow around it is tested
    replica.llm, replica.prompts = LLM(), Prompts(TokenizerFailingOn("bad"), 512, SamplingConfig().model_dump())
    assert_only_the_bad_ones_failed(replica.generate(requests_one_bad()))


def test_an_async_replicas_request_whose_prompt_cannot_be_tokenized_is_its_own_error_and_the_call_goes_on():
    """The exception went on the queue as the request's result and ``stream`` raised it: the call failed."""
    import asyncio
    import itertools

    from actors.generator import Prompts
    from actors.streaming_generator import StreamingGenerator
    from schemas.config import SamplingConfig

    class Engine:
        async def generate(self, prompt, params, request_id):
            yield finished(prompt)

    replica = object.__new__(StreamingGenerator)
    replica.engine, replica.ids, replica.chunk_s = Engine(), itertools.count(), 0.0
    replica.prompts = Prompts(TokenizerFailingOn("bad"), 512, SamplingConfig().model_dump())
    assert_only_the_bad_ones_failed(asyncio.run(replica.generate(requests_one_bad())))


def test_a_lone_surrogate_in_a_message_is_its_requests_error_on_the_real_tokenizer():
    from transformers import AutoTokenizer

    from actors.generator import Prompts
    from jobs.models import resolve
    from schemas.config import SamplingConfig
    from schemas.records import Generate

    prompts = Prompts(AutoTokenizer.from_pretrained(resolve("smollm2-135m-instruct")), 2048, SamplingConfig().model_dump())
    assert "TypeError" in prompts.prepare(Generate((("user", "What is \ud800?"),))).error
    assert len(prompts.prepare(Generate((("user", "What is 1 + 1?"),)))[0]["prompt_token_ids"]) > 10


def test_a_tokenizer_that_cannot_template_a_chat_is_refused_when_the_replica_starts_not_row_by_row():
    """Since a prompt that fails to template is its own error row, a model with no chat template would
    have ended a run "done" with every row an error; the replicas check the template when they start."""
    from transformers import AutoTokenizer

    from actors.generator import Prompts
    from jobs.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("smollm2-135m-instruct"))
    Prompts(tokenizer, 512, {}).check_template()  # a chat model's passes
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="^the model's tokenizer cannot template a chat, .{0,60}give an instruct / chat"):
        Prompts(tokenizer, 512, {}).check_template()


def test_all_cores_means_the_cores_this_process_may_use_not_every_core_of_the_host(monkeypatch):
    """In a container given CPUs 2 and 3 of a 64-core host, 'all' bound vLLM's threads to 0-63 (the replica
    failed at start, or ran 64 threads on 2 cores), and 'nobind' ran the in-process engine on one thread."""
    import os

    from actors.generator import bound_cores, configure, cpu_list
    from schemas.config import LLMConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "unset")
    configure(LLMConfig().model_dump())
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert bound_cores("all") == bound_cores("nobind") == 2 and bound_cores("auto") == 1 and bound_cores("0-7,9") == 9
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
