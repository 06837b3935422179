import re

import pytest

from schemas.config import ConfigError, load_config
from strategies.registry import AnswerConfig


def test_defaults_are_the_documented_ones():
    c = AnswerConfig()
    assert c.retrieval.k == 5
    assert c.generator.model == "qwen2.5-coder-0.5b-instruct"
    assert c.sampling.temperature == 0.0
    assert c.index.shards == 2


def test_layering_file_then_overrides_then_values(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("retrieval: {k: 7}\ngenerator: {model: from-file, replicas: 2}\n")
    c = load_config(AnswerConfig, f, ["generator.model=from-cli", "engine.generator.max_batch=8"], limit=3)
    assert (c.retrieval.k, c.generator.model, c.generator.replicas) == (7, "from-cli", 2)
    assert c.engine.generator.max_batch == 8
    assert c.limit == 3


def test_config_files_layer_field_by_field_and_a_runs_own_config_takes_overrides_into_its_null_sections(tmp_path):
    mine, calibrated = tmp_path / "mine.yaml", tmp_path / "calibrated.yaml"
    mine.write_text("retrieval: {k: 3}\nraisf: {d_th: 2, know_threshold: 0.1}\n")
    calibrated.write_text("raisf: {know_threshold: 0.9}\n")
    c = load_config(AnswerConfig, [mine, calibrated])  # the second file replaced the first whole before
    assert (c.retrieval.k, c.raisf.d_th, c.raisf.know_threshold) == (3, 2, 0.9)
    # a mapping that is one setting is replaced, not merged: a replica asking for both nodes' resources
    # could be placed nowhere
    mine.write_text("generator: {model: g, resources: {gpu_a100: 1}}\n")
    calibrated.write_text("generator: {resources: {gpu_h100: 1}}\n")
    c = load_config(AnswerConfig, [mine, calibrated])
    assert c.generator.resources == {"gpu_h100": 1} and c.generator.model == "g"
    written = tmp_path / "config.yaml"
    written.write_text("judge: null\ngenerator: {endpoint: null}\n")  # as a run's resolved config.yaml has them
    c = load_config(AnswerConfig, written, ["judge.model=qwen2.5-coder-1.5b-instruct",
                                            "generator.endpoint.base_url=http://127.0.0.1:8000/v1"])
    assert c.judge.model == "qwen2.5-coder-1.5b-instruct" and c.generator.endpoint.base_url.startswith("http")


def test_a_key_written_twice_is_refused_not_the_last_one_kept(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("retrieval: {k: 3}\nretrieval: {method: bm25}\n")  # k: 3 was dropped without a word
    with pytest.raises(ConfigError, match="key 'retrieval' is written twice"):
        load_config(AnswerConfig, twice)
    with pytest.raises(ConfigError, match="key 'k' is written twice"):
        load_config(AnswerConfig, None, ["retrieval={k: 3, k: 7}"])
    anchored = tmp_path / "anchored.yaml"  # a merge key is no repetition
    anchored.write_text("generator: &llm {model: m, max_model_len: 1024}\njudge:\n  <<: *llm\n  model: j\n")
    c = load_config(AnswerConfig, anchored)
    assert (c.judge.model, c.judge.max_model_len) == ("j", 1024)
    complex_key = tmp_path / "complex.yaml"
    complex_key.write_text("? [1, 2]\n: v\n")
    with pytest.raises(ConfigError, match="a key that is not a name"):
        load_config(AnswerConfig, complex_key)


@pytest.mark.parametrize("value, enabled", [("", True), ("0", True), ("false", True), ("off", True), ("1", False),
                                            ("yes", False)])
def test_the_no_cache_variable_reads_false_as_false(monkeypatch, value, enabled):
    monkeypatch.setenv("RAGSIFT_NO_CACHE", value)
    assert AnswerConfig().cache.enabled is enabled


@pytest.mark.parametrize(
    "override, field",
    [
        ("retrieval.kk=3", "retrieval.kk"),
        ("retrieval.k=0", "retrieval.k"),
        ("generator.max_model_len=abc", "generator.max_model_len"),
        ("strategies=[nope]", "strategies"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(AnswerConfig, None, [override])


def test_missing_file_and_malformed_override(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(AnswerConfig, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(AnswerConfig, None, ["no-equals-sign"])


def test_a_config_file_or_override_that_is_not_yaml_is_a_config_error_naming_it(tmp_path):
    """Before, a YAML typo ended the CLI with a traceback from the YAML parser."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("retrieval: {k: 7\ngenerator: model: x\n")
    with pytest.raises(ConfigError, match=r"config file .*bad\.yaml is not valid YAML: .*line") as err:
        load_config(AnswerConfig, bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"override 'retrieval.k=\[3': its value is not valid YAML"):
        load_config(AnswerConfig, None, ["retrieval.k=[3"])


@pytest.mark.parametrize("key, speed", [
    ("generator.replicas", True), ("generator.cpu_threads_bind", True), ("judge.num_gpus", True),
    ("embedder.batch_size", True), ("reranker.replicas", True), ("know.device", True), ("ray.address", True),
    ("engine.generator.max_batch", True), ("engine.window", True), ("index.shards", True), ("limit", True),
    ("label.match", True), ("input.read_batch_rows", True), ("commit.row_group_rows", True),
    ("generator.model", False), ("generator.max_model_len", False), ("sampling.max_tokens", False),
    ("engine.max_nodes_per_root", False), ("label.collect", False), ("index.path", True),
    # how failures are ridden out decides which rows are error rows (answered again by --retry-errors), never an answer
    ("engine.max_attempts", True), ("engine.fail_fast_after", True), ("engine.replica_max_restarts", True),
    ("raisf.know_threshold", False), ("answer_form.by_kind.yes-no", False), ("commit.shard_rows", False),
    ("reranker.model", False), ("reranker.max_length", False),
    # where the thresholds came from: the thresholds are their sections' fields
    ("calibration.questions", True), ("calibration.n", True), ("calibration.chosen", True),
])
def test_fields_say_whether_they_change_answers(key, speed):
    """The resume identity reads the schema: speed settings may change between runs, the rest may not."""
    from schemas.config import speed_setting
    assert speed_setting(AnswerConfig, key) is speed


def test_an_object_store_ray_refuses_is_refused_at_load():
    with pytest.raises(ConfigError, match="ray.object_store_mb"):  # Ray's traceback, after the output was claimed
        load_config(AnswerConfig, None, ["ray.object_store_mb=64"])


def test_values_are_read_as_yaml_1_2_where_no_is_a_word_and_010_is_ten(tmp_path):
    """YAML 1.1 (PyYAML's default) made `no` / `off` booleans, refused as a split's name, and `010` octal 8."""
    c = load_config(AnswerConfig, None, ["retrieval.k=010", "input.split=no", "cache.enabled=false"])
    assert (c.retrieval.k, c.input.split, c.cache.enabled) == (10, "no", False)
    f = tmp_path / "c.yaml"
    f.write_text("input: {split: off}\nretrieval: {k: 0x8}\n")
    assert (load_config(AnswerConfig, f).input.split, load_config(AnswerConfig, f).retrieval.k) == ("off", 8)


def test_a_mapping_key_holding_a_dot_is_quoted_and_unquoted_it_is_refused_naming_the_quoted_form():
    """``answer_form.by_dataset.my.qa=yes_no`` was split at every dot: a dataset ``my`` holding ``qa``, refused as
    "by_dataset.my: Input should be 'short', ...", which named no way to set a dataset named ``my.qa``."""
    config = load_config(AnswerConfig, None, ['answer_form.by_dataset."my.qa"=yes_no', 'generator.resources."a=b"=2'])
    assert config.answer_form.by_dataset == {"my.qa": "yes_no"} and config.generator.resources == {"a=b": 2}
    with pytest.raises(ConfigError, match=r"answer_form\.by_dataset maps names to values.*"
                                          r"--set 'answer_form\.by_dataset\.\"my\.qa\"=VALUE'"):
        load_config(AnswerConfig, None, ["answer_form.by_dataset.my.qa=yes_no"])
    # a mapping whose values nest (vLLM's engine_kwargs) still takes a dotted path into them
    nested = load_config(AnswerConfig, None, ["generator.engine_kwargs.compilation_config.level=3"])
    assert nested.generator.engine_kwargs == {"compilation_config": {"level": 3}}
    with pytest.raises(ConfigError, match="no closing"):
        load_config(AnswerConfig, None, ['answer_form.by_dataset."my.qa=yes_no'])


@pytest.mark.parametrize("override", ["=0", "retrieval..k=5", ".retrieval.k=5", "retrieval.=5"])
def test_an_override_with_an_empty_name_in_its_key_is_refused_saying_so(override):
    """``--set =0`` said "Extra inputs are not permitted": the empty name was taken as a field."""
    with pytest.raises(ConfigError, match="an empty name in its dotted key"):
        load_config(AnswerConfig, None, [override])


@pytest.mark.parametrize("override", ["retrieval.k=true", "sampling.max_tokens=true", "engine.max_depth=false",
                                      "sampling.temperature=true", "limit=true"])
def test_a_boolean_is_no_number(override):
    """pydantic took true as 1: `--set retrieval.k=true` ran with k = 1 and said nothing."""
    with pytest.raises(ConfigError, match=rf"{override.split('=')[0]}: .*a number, not (true|false)"):
        load_config(AnswerConfig, None, [override])


@pytest.mark.parametrize("verdicts", ["[]", '[""]', "[SUPPORTS, supports]"])
def test_verdicts_are_distinct_labels_at_least_one(verdicts):
    """`answer_form.verdicts=[]` passed, then failed after Ray and vLLM had started, the output claimed."""
    with pytest.raises(ConfigError, match="answer_form.verdicts"):
        load_config(AnswerConfig, None, [f"answer_form.verdicts={verdicts}"])


def test_a_label_yaml_reads_as_a_boolean_is_refused_with_how_to_quote_it():
    """`answer_form.verdicts=[TRUE, FALSE]` said "Input should be a valid string", not why nor what to write."""
    with pytest.raises(ConfigError, match=r"answer_form.verdicts.0: .*YAML reads true as a boolean: quote the text"):
        load_config(AnswerConfig, None, ["answer_form.verdicts=[TRUE, FALSE]"])
    quoted = load_config(AnswerConfig, None, ['answer_form.verdicts=["TRUE", "FALSE"]'])
    assert quoted.answer_form.verdicts == ["TRUE", "FALSE"]


@pytest.mark.parametrize("bind, ok", [("abc", False), ("0-", False), ("all", True), ("nobind", True),
                                      ("0-7", True), ("0,2,4-5|6-7", True)])
def test_a_thread_binding_vllm_cannot_read_fails_naming_the_field(bind, ok):
    """'abc' passed and failed the replicas at start: "Engine core initialization failed", no field named."""
    if ok:
        assert load_config(AnswerConfig, None, [f"generator.cpu_threads_bind={bind}"]).generator.cpu_threads_bind == bind
    else:
        with pytest.raises(ConfigError, match="generator.cpu_threads_bind"):
            load_config(AnswerConfig, None, [f"generator.cpu_threads_bind={bind}"])


def test_every_setting_says_what_it_does():
    """A documented, typed field per setting (vLLM's config classes): 45 fields had no description, so
    `--help`-style listings and readers of schemas/config.py met bare names (`max_wait_s`, `seed`)."""
    from pydantic import BaseModel

    from schemas import config as config_module
    from schemas.config import section_of

    sections = {AnswerConfig} | {c for c in vars(config_module).values()
                                 if isinstance(c, type) and issubclass(c, BaseModel) and c.__module__ == config_module.__name__}
    bare, seen = [], set()
    while sections:
        cls = sections.pop()
        seen.add(cls)
        for name, field in cls.model_fields.items():
            section = section_of(field.annotation)
            if section is not None:  # documented by its class
                sections |= {section} - seen
            elif not field.description:
                bare.append(f"{cls.__name__}.{name}")
    assert not bare, bare


def test_a_config_ragsift_writes_loads_back_to_the_same_values(tmp_path):
    """config.yaml and calibrated.yaml were written by YAML 1.1's dumper and read by the 1.2 loader: '08' was
    written bare and read back as 8 (a by_dataset key refused, an engine argument's revision changed), and
    `--set input.split=2024-01-01` was a date, refused as no string."""
    from schemas.config import dump_yaml
    from strategies.registry import AnswerConfig

    config = load_config(AnswerConfig, None, ["answer_form.by_dataset={'08': short, '0o17': yes_no}",
                                              "generator.engine_kwargs={revision: '09'}", "input.split=2024-01-01"])
    assert config.input.split == "2024-01-01"
    written = tmp_path / "config.yaml"
    written.write_text(dump_yaml(config.model_dump(mode="json", exclude_none=True)))
    again = load_config(AnswerConfig, str(written))
    assert again.answer_form.by_dataset == {"08": "short", "0o17": "yes_no"}
    assert again.generator.engine_kwargs == {"revision": "09"} and again.input.split == "2024-01-01"


@pytest.mark.parametrize(("override", "refusal"), [
    ("generator.engine_kwargs.gpu_memory_utilization=0.5", r"generator\.engine_kwargs: .*gpu_memory_utilization is this "
                                                           r"pool's own field: set it beside engine_kwargs"),
    ("judge.engine_kwargs.seed=1", r"judge\.engine_kwargs: .*seed is this pool's own field"),
    ("generator.engine_kwargs.distributed_executor_backend=mp", "distributed_executor_backend: ragsift sets it itself"),
    ("generator.engine_kwargs.disable_log_stats=false", "disable_log_stats: ragsift sets it itself under serving: async")])
def test_an_engine_argument_a_typed_field_or_ragsift_sets_is_refused_in_engine_kwargs_naming_the_field(override, refusal):
    """`generator.engine_kwargs.gpu_memory_utilization=0.5` validated, then every replica died with "dict() got
    multiple values for keyword argument": actors/generator.py passes the field's value as well."""
    with pytest.raises(ConfigError, match=refusal):
        load_config(AnswerConfig, None, [override])
    batch = load_config(AnswerConfig, None, ["generator.serving=batch", "generator.engine_kwargs.disable_log_stats=false"])
    assert batch.generator.engine_kwargs == {"disable_log_stats": False}  # vllm.LLM takes it from engine_kwargs alone


def test_floats_are_read_as_yaml_1_2_where_1_30_5_is_text_and_infinity_is_refused_where_it_means_nothing(tmp_path):
    """YAML 1.1's float resolver was still on: `engine.generator.max_wait_s=1:30.5` read 90.5 (sexagesimal), and
    `sampling.temperature=.inf` or an endpoint's `timeout_s: .inf` were taken."""
    with pytest.raises(ConfigError, match=r"engine\.generator\.max_wait_s: Input should be a valid number"):
        load_config(AnswerConfig, None, ["engine.generator.max_wait_s=1:30.5"])
    c = load_config(AnswerConfig, None, ["engine.generator.max_wait_s=1e-1", "sampling.top_p=.5", "input.split=1_0.5"])
    assert (c.engine.generator.max_wait_s, c.sampling.top_p, c.input.split) == (0.1, 0.5, "1_0.5")
    f = tmp_path / "c.yaml"
    f.write_text("generator: {model: m, endpoint: {base_url: 'http://127.0.0.1:8000/v1', timeout_s: .inf}}\n")
    for file, overrides in ((None, ["sampling.temperature=.inf"]), (None, ["sampling.top_p=.nan"]),
                            (None, ["engine.generator.timeout_s=.inf"]), (f, [])):
        with pytest.raises(ConfigError, match=r"(temperature|top_p|timeout_s): Input should be a finite number"):
            load_config(AnswerConfig, file, overrides)


@pytest.mark.parametrize("setting", ["engine.failure_cooldown_s=.inf", "engine.generator.max_wait_s=.inf",
                                     "retrieval.dense_weight=.nan", "retrieval.bm25_weight=.inf", "index.bm25_k1=.inf",
                                     "raisf.know_threshold=.nan", "embedder.num_gpus=.inf"])
def test_no_float_field_of_any_section_takes_infinity_or_nan_and_the_error_names_it(setting):
    """Only temperature, top_p and the timeouts refused them: `engine.failure_cooldown_s=.inf` stopped a stage for
    good after a failure, and a .nan weight ranked every hybrid passage alike."""
    field = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(field)}: Input should be a finite number"):
        load_config(AnswerConfig, None, [setting])


def test_an_endpoints_request_rate_refuses_infinity():
    with pytest.raises(ConfigError, match=r"requests_per_second: Input should be a finite number"):
        load_config(AnswerConfig, None, ["generator.endpoint={base_url: 'http://127.0.0.1:8000/v1', "
                                         "requests_per_second: .inf}"])


def test_a_tilde_in_a_config_file_path_is_the_home_folder_and_a_uri_for_the_cache_path_is_refused(tmp_path, monkeypatch):
    """`--config ~/c.yaml` (quoted, or from a script) said the file does not exist, and `cache.path=s3://b/c.sqlite`
    created a local SQLite file under a folder named "s3:"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "c.yaml").write_text("retrieval: {k: 7}\n")
    assert load_config(AnswerConfig, "~/c.yaml").retrieval.k == 7 and load_config(AnswerConfig, ["~/c.yaml"]).retrieval.k == 7
    assert load_config(AnswerConfig, None, ["cache.path=~/requests.sqlite"]).cache.path == str(tmp_path / "requests.sqlite")
    with pytest.raises(ConfigError, match=r"cache\.path: .*a local SQLite file .*not a URI"):
        load_config(AnswerConfig, None, ["cache.path=s3://bucket/requests.sqlite"])
