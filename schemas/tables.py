"""Arrow schemas of ragsift's tables and the checks that guard inputs."""

from __future__ import annotations

import pyarrow as pa

from schemas.errors import UserError

# Questions: `id` and `question` are required; the rest is optional (used by `evaluate`).
# text or bytes: a question that is not valid UTF-8 becomes an error row (jobs/questions.py), not a schema error
QUESTION_REQUIRED = {"id": pa.string(), "question": pa.binary()}
QUESTION_OPTIONAL = {
    "answers": pa.list_(pa.string()),
    "dataset": pa.string(),
    "kind": pa.string(),
    "gold_passage_ids": pa.list_(pa.string()),
    "meta": pa.string(),
}

CORPUS_REQUIRED = {"id": pa.string(), "text": pa.string()}
CORPUS_OPTIONAL = {"title": pa.string()}

PASSAGES = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])

ANSWERS = pa.schema(
    [
        ("id", pa.string()),
        ("question", pa.string()),
        ("strategy", pa.string()),
        ("answer", pa.string()),
        ("resolved_by", pa.string()),
        ("retrieved_ids", pa.list_(pa.string())),
        ("retrieved_scores", pa.list_(pa.float32())),
        ("citations", pa.list_(pa.string())),
        ("n_llm_calls", pa.int32()),
        ("n_retrievals", pa.int32()),
        ("n_subquestions", pa.int32()),
        ("depth", pa.int32()),
        ("n_parse_failures", pa.int32()),
        ("n_truncated", pa.int32()),  # generations that stopped at their max_tokens (finish_reason "length")
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("step_tokens", pa.map_(pa.string(), pa.int64())),  # prompt + completion tokens by the strategy's step
        ("latency_s", pa.float64()),
        ("trace", pa.string()),
        ("error", pa.string()),
    ]
)

# `ragsift label` output, one table per kind (each row also has chat messages in <kind>.jsonl).
LABELS = {
    "self_knowledge": pa.schema([("id", pa.string()), ("question", pa.string()), ("closed_book_answer", pa.string()),
                                 ("gold_answers", pa.list_(pa.string())), ("label", pa.string())]),
    "relevance": pa.schema([("id", pa.string()), ("question", pa.string()), ("passage_id", pa.string()),
                            ("passage", pa.string()), ("p_yes", pa.float64()), ("label", pa.string()),
                            # the passage is one of the question's gold passages (null: the question has none)
                            ("gold_passage", pa.bool_())]),
    "decomposition": pa.schema([("id", pa.string()), ("question", pa.string()),
                                ("sub_questions", pa.list_(pa.string()))]),
    "self_reasoning": pa.schema([("id", pa.string()), ("question", pa.string()), ("passage_ids", pa.list_(pa.string())),
                                 ("trajectory", pa.string()), ("answer", pa.string()),
                                 ("gold_answers", pa.list_(pa.string())), ("citation_precision", pa.float64()),
                                 ("citation_recall", pa.float64())]),
}


def conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s columns: a part written by an earlier ragsift lacks the columns added
    since (``n_truncated``), which its rows do not know: null there."""
    columns = [table[f.name] if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


class SchemaError(UserError):
    """An input file whose columns do not match what a job needs."""


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_null(actual):  # what pyarrow infers for a column of only nulls (or only empty lists)
        return True
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_binary(expected):
        return any(f(actual) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                       pa.types.is_large_binary))
    if pa.types.is_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _compatible(
            actual.value_type, expected.value_type
        )
    return actual.equals(expected)


def check_schema(schema: pa.Schema, required: dict, optional: dict, source: str) -> list[str]:
    """Raise SchemaError naming the file and column; return the optional columns present."""
    for name, dtype in required.items():
        if name not in schema.names:
            raise SchemaError(f"{source}: missing required column {name!r} (has {schema.names})")
        if not _compatible(schema.field(name).type, dtype):
            raise SchemaError(
                f"{source}: column {name!r} has type {schema.field(name).type}, expected {dtype}"
            )
    present = []
    for name, dtype in optional.items():
        if name in schema.names:
            if not _compatible(schema.field(name).type, dtype):
                raise SchemaError(
                    f"{source}: column {name!r} has type {schema.field(name).type}, expected {dtype}"
                )
            present.append(name)
    return present
