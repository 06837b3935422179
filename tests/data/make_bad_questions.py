"""Writes bad_questions.parquet: one row per bad-row case of the input policy (jobs/questions.py).

    python tests/data/make_bad_questions.py
"""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# (id, question bytes or None, what the policy says happens)
CASES = [
    ("ok-1", b"Who wrote Hamlet?", "answered"),
    (None, b"A row without an id?", "error: null id"),
    ("null-question", None, "error: empty question"),
    ("empty", b"", "error: empty question"),
    ("blank", b" \t\n ", "error: empty question"),
    ("huge", b"why " * 262_144, "error: question too long"),  # 1 MiB
    ("bad-utf8", b"caf\xe9 au lait?", "error: invalid UTF-8"),
    ("control", b"What is\x00 the\x1b capital\x07 of France?", "answered, control characters removed"),
    ("only-control", b"\x01\x02\x03", "error: empty question"),
    ("dup", b"Which river flows through Paris?", "answered (first occurrence)"),
    ("ok-2", "Qui a peint la Joconde ? \u2014 \U0001F3A8".encode(), "answered"),
    ("dup", b"A second row with the same id", "dropped, counted"),
]

if __name__ == "__main__":
    questions = pa.array([q for _, q, _ in CASES], pa.binary()).cast(pa.string(), safe=False)
    table = pa.table({"id": [i for i, _, _ in CASES], "question": questions,
                      "expected": [e for _, _, e in CASES]})
    pq.write_table(table, Path(__file__).with_name("bad_questions.parquet"), compression="zstd")
