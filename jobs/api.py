"""Python API for notebooks: run strategies over in-memory tables and get the answers back.

    from jobs.api import Session, answer_table

    with Session(index_dir="~/.cache/ragsift/indexes/demo", generator="qwen2.5-coder-0.5b-instruct") as s:
        rag = s.answer(df1, "rag")                 # starts Ray and the pools the strategy needs
        both = s.answer(df2, ["rag", "raisf"])      # reuses them: no new vLLM start, no shard reload
    answers = answer_table(df, "rag", index_dir=..., columns={"question": "query"})   # a one-call Session

The questions (a pandas DataFrame, Arrow table, ``datasets.Dataset`` or list of dicts) are written to
Parquet and answered by the same ``answer`` job as the CLI (same engine, config, exactly-once
output), then read back: one row per (question, strategy), as a DataFrame for DataFrame input and
an Arrow table otherwise. The keywords are the CLI's flags (``index_dir``, ``generator``), plus
``config`` (a YAML file) and ``overrides`` (``--set`` strings). A Session keeps its actor pools warm
across calls, as ``vllm.LLM`` keeps its engine; the model settings are the Session's, while each call
may name other strategies (a pool a new strategy needs is started then) and other questions.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from engine.gpu_packing import described, gpus_needed
from jobs.question_sources import to_arrow, write_input
from jobs.questions import check_questions as check_columns
from jobs.questions import stand_in_row
from schemas.config import validated
from schemas.errors import UserError
from schemas.tables import ANSWERS, conformed


def write_questions(table: pa.Table, folder: str) -> str:
    """The questions as Parquet under ``folder``/_input, named by their rows (``write_input``): the same
    questions resume the same run, and other questions cannot overwrite the file an earlier run was
    answered from."""
    # the rows, not their Arrow layout: a DataFrame and a Dataset of the same questions are one run
    digest = hashlib.sha256(json.dumps(table.to_pylist(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return write_input(table, folder, digest)


def in_input_order(answers: pa.Table, questions: pa.Table, strategies: list[str]) -> pa.Table:
    """The rows of ``strategies`` (an output may hold others), each strategy's in the questions' order
    (the engine writes them as they finish); a repeated id is answered once, at its first row."""
    position = {qid: i for i, qid in reversed(list(enumerate(questions["id"].to_pylist())))}
    rank = {s: i for i, s in enumerate(strategies)}
    ids, names = answers["id"].to_pylist(), answers["strategy"].to_pylist()

    def row_of(qid) -> int:  # a null id is answered as "<row N>" (jobs/questions.py)
        if qid in position:
            return position[qid]
        row = stand_in_row(qid)
        return questions.num_rows if row is None else row

    keep = sorted((i for i in range(answers.num_rows) if names[i] in rank),
                  key=lambda i: (rank[names[i]], row_of(ids[i]), str(ids[i])))
    return answers.take(pa.array(keep, pa.int64()))


def as_dataframe(answers: pa.Table):
    """The answers as a DataFrame that ``to_parquet`` writes back: step_tokens (a map) as a dict a row, None
    for a row without steps (an error row). As (key, value) pairs it could not be written; pandas stores the
    dicts as a struct, and one of only empty dicts (every row an error) is a struct without fields."""
    frame = answers.to_pandas(maps_as_pydicts="strict")
    frame["step_tokens"] = [tokens or None for tokens in frame["step_tokens"]]
    return frame


def check_questions(table: pa.Table) -> None:
    """The questions' required columns and their types, or a clear error naming ``columns=``."""
    if table.num_rows == 0:
        raise UserError("no questions to answer")
    check_columns(table.schema, "the questions", rename=lambda missing: "name your own columns with columns={"
                  + ", ".join(f"'{c}': '<yours>'" for c in missing) + "}")


class Session:
    def __init__(self, *, index_dir: str | None = None, generator: str | None = None, config: str | None = None,
                 overrides: list[str] = (), log=None):
        from schemas.config import as_override, load_config
        from strategies.registry import AnswerConfig

        overrides = [overrides] if isinstance(overrides, str) else list(overrides)  # one "a.b=1", not its letters
        extra = [as_override("index.path", str(Path(index_dir).expanduser()))] if index_dir else []
        extra += [as_override("generator.model", generator)] if generator else []
        self.config = load_config(AnswerConfig, config, [*overrides, *extra])
        self.log = log or (lambda *a, **k: None)
        self.stages: dict = {}
        self.cache = None  # the request cache of this Session's pools, opened with them
        self.started_ray = False
        self.ray = None  # the Ray connection its pools run on (ray_connection); they die with it
        self.gpus: list[float] = []  # each GPU reservation its pools hold there (jobs/pools.py gpu_demands)
        self.calls = 0
        SESSIONS.add(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def answer(self, questions: Any, strategies: list[str] | str = "rag", *, columns: dict[str, str] | None = None,
               output: str | None = None):
        """Answer ``questions`` with each strategy on this Session's pools: one row per (question id,
        strategy), strategies in the order given, questions in the input's order. ``output`` keeps the
        run (answers, metrics.json) there instead of in a temporary directory, and resumes it: a later
        call with the same questions adds strategies to it; one with other questions is refused."""
        from jobs.answer import answer, check_output
        from jobs.evaluate import answer_files

        table = to_arrow(questions, columns)
        check_questions(table)  # before Ray and the models start, not after
        strategies = [strategies] if isinstance(strategies, str) else list(strategies)
        with tempfile.TemporaryDirectory(prefix="ragsift-") as tmp:
            # validated, as the command line's config is: an unknown strategy is a ConfigError naming the choices
            config = validated(type(self.config), {**self.config.model_dump(), "strategies": strategies,
                                                   "questions": write_questions(table, tmp),
                                                   "output": output or str(Path(tmp) / "answers")})
            if output:  # refused before its questions are written there too (the folder then held two runs' inputs)
                check_output(config, hint="pass another output=, or remove that folder to answer there afresh")
                config = validated(type(config), {**config.model_dump(), "questions": write_questions(table, output)})
            self._start(config)
            answer(config, log=self.log, stages=self.stages, cache=self.cache)
            answers = pa.concat_tables([conformed(pq.read_table(f), ANSWERS) for f in answer_files(config.output)])
        self.calls += 1
        answers = in_input_order(answers, table, strategies)
        return as_dataframe(answers) if type(questions).__module__.startswith("pandas") else answers

    def _start(self, config) -> None:
        """Start the pools ``config``'s strategies need and this Session does not have yet."""
        import ray

        from jobs.pools import build_stages, gpu_demands, pool_plan, ray_request
        from jobs.ray_session import init_ray
        from jobs.request_cache import open_cache
        from strategies.registry import make_strategy

        if (self.stages or self.ray is not None) and not self._on_its_ray():
            # its Ray was shut down under it (another Session's close) or replaced (ray.shutdown, then ray.init):
            # pools of a Ray that is gone are started again, on the Ray there is now or on one of ours
            self.stages, self.started_ray, self.gpus = {}, False, []
        if self.cache is None:
            self.cache = open_cache(self.config)
        needs = set().union(*(make_strategy(n, config).stages for n in config.strategies))
        covered = set(self.stages) | ({"judge"} if "generator" in self.stages and config.judge is None else set())
        missing = needs - covered
        if not missing:
            return
        # a pool already running is not started twice (pool_plan plans the generator beside a judge, and
        # the encoder for a ranker without a model of its own: the retriever's encoders are that pool)
        running = {"encoder": self.stages["retriever"].replicas} if "retriever" in self.stages else {}
        plan = {name: pool for name, pool in pool_plan(config, missing).items()
                if name not in self.stages and name not in running}
        if not ray.is_initialized():
            init_ray(config.ray, *ray_request(config, plan))
            self.started_ray, self.ray = True, ray_connection()  # closed by close(), even if no pool starts
            SESSIONS_RAY.add(self.ray)
        elif self.started_ray or ray_connection() in SESSIONS_RAY:
            # a Ray a Session started is sized for that Session's first call: another Session's pools there
            # waited for ever while the first one's held its CPUs
            whose = "this Session" if self.started_ray else "another Session of this process"
            cpus, resources, gpus = ray_request(config, plan)
            # Ray places a GPU reservation device by device (engine/gpu_packing.py): 0.8 GPU free as 0.4 on
            # each of two devices holds no 0.6, so the sum below passed such a pool and it waited for ever
            here = ray_connection()
            held = [gpu for session in SESSIONS if session.ray == here for gpu in session.gpus]
            no_device(plan, held, gpus, ray.cluster_resources().get("GPU", 0.0), whose)
            deadline = time.monotonic() + FREED_WITHIN_S
            while True:  # what the last call's engine actors held is freed a moment after they are killed
                try:
                    unplaceable(plan, (cpus, {**resources, "GPU": sum(gpus)}), ray.available_resources(), whose)
                    break
                except UserError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        self.stages.update(build_stages(config, missing, plan, running))
        self.gpus += gpu_demands(plan)
        self.ray = ray_connection()  # the Ray of these pools: the user's, when this Session did not start one

    def _on_its_ray(self) -> bool:
        """Whether this process is still connected to the Ray this Session's pools were started on."""
        connection = ray_connection()
        return connection is not None and connection == self.ray

    def actors(self) -> list:
        """Every actor this Session started (each stage's replicas, the shards of its retriever)."""
        found = []
        for stage in self.stages.values():
            found += [*stage.replicas, *getattr(stage, "shards", [])]
        return found

    def close(self, wait_s: float = 60.0) -> None:
        """Stop the pools (and Ray, if this Session started it); return once they are gone, so that
        what they held (GPUs, memory) is free for the next Session or job on this Ray, or after ``wait_s``."""
        import ray

        from jobs.pools import stop_llm_engines

        deadline = time.monotonic() + wait_s  # for the engines and the actors together (it waited for each in turn)
        try:
            if self._on_its_ray():  # on another Ray, or none, its pools are gone with theirs: nothing to stop
                try:  # a Ctrl-C in the engines' wait (up to wait_s) left the actors, their GPUs and Ray running
                    stop_llm_engines(self.stages, wait_s)
                finally:
                    actors = self.actors()
                    for actor in actors:
                        ray.kill(actor)
                    if self.started_ray:
                        ray.shutdown()
                    else:
                        try:
                            wait_until_dead(actors, max(0.0, deadline - time.monotonic()))
                        finally:  # the devices a multi-device replica's group reserved, Ctrl-C or not
                            for stage in self.stages.values():
                                for group in getattr(stage, "placement_groups", []):
                                    ray.util.remove_placement_group(group)
        finally:
            self.stages.clear()
            self.started_ray, self.ray, self.gpus = False, None, []


def ray_connection() -> tuple[str, str] | None:
    """This process's Ray connection now, or None: the driver's node and job. A new local Ray has another
    node (its job ids start again at 01000000); joining the same cluster again is another job."""
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_job_id()


FREED_WITHIN_S = 15.0
SESSIONS_RAY: set = set()  # the Rays (ray_connection) Sessions of this process started
SESSIONS: weakref.WeakSet = weakref.WeakSet()  # this process's Sessions, whose pools hold GPUs on those Rays


def unplaceable(plan: dict, request: tuple[float, dict[str, float]], available: dict[str, float],
                whose: str = "this Session") -> None:
    """Refuse pools a Session's own Ray, sized for its first call, cannot place: Ray would leave them
    waiting, and the call with them, for ever."""
    cpus, resources = request
    short = {name: need for name, need in {"CPU": cpus, **resources}.items()
             if need and need > available.get(name, 0.0) + 1e-9}
    if short:
        raise refusal(whose, plan, f" ({', '.join(f'{k} {v:g}, {available.get(k, 0.0):g} free' for k, v in short.items())})")


def no_device(plan: dict, held: list[float], asked: tuple[float, ...], devices: float,
              whose: str = "this Session") -> None:
    """Refuse GPU reservations that no arrival order places on a Session's own Ray beside those its Sessions'
    pools ``held``: Ray would leave them waiting, and the call with them, for ever."""
    if not asked or (needed := gpus_needed([*held, *asked])) <= devices:
        return
    raise refusal(whose, plan, f": GPU reservations of {described(asked)} beside the {described(held) or 'none'} held "
                  f"there need {needed} device{'s' * (needed != 1)} and it has {devices:g} (Ray puts each fraction on "
                  "one device)")


def refusal(whose: str, plan: dict, why: str) -> UserError:
    """The one-line refusal of pools a Session's own Ray cannot place, ``why`` after what they ask for."""
    advice = ("name every strategy in its first call" if whose == "this Session"
              else "use that Session for these calls too, or close it first (its pools hold them)")
    return UserError(f"{whose} started Ray for its first call, which cannot place the pools {sorted(plan)} ask for "
                     f"now{why}: {advice}, or give it a Ray of your own with room for them (ray.address)")


def wait_until_dead(actors: list, wait_s: float) -> None:
    """Wait for killed actors to die: ray.kill only asks the GCS to, and a call made at once may
    still be answered by the old process."""
    import ray

    deadline = time.monotonic() + wait_s
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.1)


def answer_table(questions: Any, strategies: list[str] | str = "rag", *, index_dir: str | None = None,
                 generator: str | None = None, columns: dict[str, str] | None = None, config: str | None = None,
                 overrides: list[str] = (), output: str | None = None, log=None):
    """One call of a Session of its own: answer ``questions`` with each strategy; see the module docstring."""
    with Session(index_dir=index_dir, generator=generator, config=config, overrides=overrides, log=log) as session:
        return session.answer(questions, strategies, columns=columns, output=output)
