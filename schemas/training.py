"""Settings of ``ragsift train`` (jobs/train.py): one typed section per judge it trains. Every field
decides the weights except ``threads``; the model card records the data they chose and the
training settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from schemas.config import SPEED, Section, home_expanded

EXCLUDE = "id lists (one id a line) or question Parquet files whose questions are never trained on"


class RelevanceTraining(Section):
    """M_rel: (question, passage) -> relevant, positives the gold passages, negatives mined by retrieval."""

    output: str = Field(description="model directory to write (with --mine-only: where pairs.parquet goes)")
    questions: str | None = Field(None, description="questions with gold_passage_ids (any file `answer` reads), to "
                                                 "mine pairs from")
    index_dir: str | None = Field(None, description="the index the negatives are mined from")
    pairs: str | None = Field(None, description="train from a --mine-only run's pairs.parquet instead of mining")
    mine_only: bool = Field(False, description="mine the pairs, write them and stop (train where the GPU is)")
    exclude: list[str] = Field(default_factory=list, description=EXCLUDE)
    base: str = Field("all-minilm-l6-v2", description="model to start from (alias, path or hub name)")
    architecture: Literal["bi-encoder", "cross-encoder"] = Field(
        "bi-encoder", description="bi-encoder: fine-tune the embedder's cosine (learns in CPU time); "
                                  "cross-encoder: a CrossEncoder with a new head (needs a GPU's worth of steps)")
    negatives: int = Field(3, ge=0, description="hard negatives per question and retrieval method")
    random_negatives: int = Field(1, ge=0, description="easy negatives per question: passages other questions retrieved")
    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(5e-5, gt=0)
    max_length: int = Field(256, ge=16, description="tokens of question + passage the model reads")
    held_out: float = Field(0.1, ge=0, lt=1, description="share of questions kept out of training (by id hash)")
    per_dataset: int | None = Field(None, ge=1, description="at most N questions of each dataset (in file order)")
    limit: int | None = Field(None, ge=1, description="only the first N questions (quick runs)")
    seed: int = 0
    threads: int | None = Field(None, ge=1, json_schema_extra=SPEED, description="torch threads on CPU (default: every core)")
    bf16: bool = Field(False, description="bfloat16 mixed precision (GPUs, and CPUs with AVX512-BF16 / AMX)")

    @field_validator("output", "questions", "index_dir", "pairs", "exclude")
    @classmethod
    def _home(cls, value):
        return [home_expanded(v) for v in value] if isinstance(value, list) else home_expanded(value)

    @model_validator(mode="after")
    def _one_source_of_pairs(self) -> RelevanceTraining:
        if self.pairs and self.mine_only:
            raise ValueError("mine_only mines pairs; pairs trains from pairs mined earlier: give one of them")
        mining = sorted(self.model_fields_set & {"questions", "index_dir", "negatives", "random_negatives",
                                                 "per_dataset", "limit"})
        if self.pairs and mining:
            raise ValueError(f"{', '.join(mining)}: settings of mining, which pairs ({self.pairs}) was done with; "
                             "mine again with them, or leave them out")
        if not self.pairs and not (self.questions and self.index_dir):
            raise ValueError("give questions and index_dir (to mine pairs) or pairs")
        return self


class KnowTraining(Section):
    """M_know: question -> will this generator answer it correctly closed-book, from label know / unknown."""

    labels: str = Field(description="a `ragsift label` output directory")
    output: str = Field(description="model directory to write")
    exclude: list[str] = Field(default_factory=list, description=EXCLUDE)
    embedder: str = Field("all-minilm-l6-v2", description="question vectors (alias, path or hub name)")
    c: float = Field(1.0, gt=0, description="inverse regularisation strength of the logistic regression")
    held_out: float = Field(0.1, ge=0, lt=1, description="share of questions kept out of training (by id hash)")

    @field_validator("labels", "output", "exclude")
    @classmethod
    def _home(cls, value):
        return [home_expanded(v) for v in value] if isinstance(value, list) else home_expanded(value)
