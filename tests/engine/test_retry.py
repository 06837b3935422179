"""How a failed batch is run again (pure: no Ray)."""

from engine.loop import retry_plan


def test_a_batch_that_fails_once_runs_again_whole():
    assert retry_plan(list("abcd"), 0, max_attempts=3) == [(list("abcd"), 1)]
    assert retry_plan([], 1, max_attempts=3) == []  # nothing left of it to run again


def test_a_batch_that_fails_twice_splits_into_suspect_halves():
    assert retry_plan(list("abcde"), 1, max_attempts=3) == [(list("ab"), 1), (list("cde"), 1)]
    assert retry_plan(list("ab"), 1, max_attempts=3) == [(["a"], 0), (["b"], 0)]


def test_a_request_alone_gets_max_attempts_tries():
    assert retry_plan(["a"], 0, max_attempts=3) == [(["a"], 1)]
    assert retry_plan(["a"], 1, max_attempts=3) == [(["a"], 2)]
    assert retry_plan(["a"], 2, max_attempts=3) is None
    assert retry_plan(["a"], 0, max_attempts=1) is None


def test_a_poison_request_in_a_batch_of_eight_is_isolated_in_a_bounded_number_of_failures():
    failures, queue, isolated = 0, [(list(range(8)), 0)], []
    while queue:
        batch, attempts = queue.pop()
        if 5 not in batch:
            continue  # these succeed
        failures += 1
        plan = retry_plan(batch, attempts, max_attempts=3)
        if plan is None:
            isolated.append(batch)
        else:
            queue.extend(plan)
    assert isolated == [[5]] and failures == 2 + 2 + 3  # whole twice, halves of 4 and 2, then alone 3 times


def test_a_failed_generator_batch_answers_each_request_with_its_own_failure_type():
    # a failed judgment must stay an error: answered with a Generation it crashed RA-ISF's
    # self-knowledge step and counted as "irrelevant" in its relevance step
    from engine.stages import GeneratorStage
    from schemas.config import StageBatching
    from schemas.records import Generate, Generation, Judge, Judgment

    failed = GeneratorStage([object()], StageBatching()).failed(
        [Judge((("user", "q"),)), Generate((("user", "q"),))], "generator failed 3 times")
    assert [type(r) for r in failed] == [Judgment, Generation]
    assert all(r.error == "generator failed 3 times" for r in failed)
