"""BM25 search of one shard (bm25s) over its passage store; query texts in, top-k out.

Tokenization (the same at build and query time): lower-cased, words of 2+ word characters
(bm25s' default pattern) and each Chinese / Japanese character (kana, kanji) a token of its own (their
text has no spaces: a whole clause was one word, which no question repeats, so BM25 found nothing),
English stopwords removed, Snowball English stemming (PyStemmer). Korean keeps its spaced words.
Scores use the shard's own document frequencies, like per-shard IDF in Elasticsearch/Lucene:
merged rankings across shards are close to, not identical with, one global BM25 index.
"""

from __future__ import annotations

import json
from pathlib import Path

from actors.passages import PassageStore
from schemas.records import Passage

NO_WORDS = "no_words"  # in bm25/ of a shard whose passages hold no word to index
# kana (not the middle dot U+30FB, punctuation), iteration / closing marks and the ideographic zero, CJK ideographs
# (Ext. A, compatibility, Ext. B onwards), half-width katakana
UNSPACED = ("\u3005-\u3007\u3040-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
             "\U00020000-\U0003134f")
# on text without those characters the same tokens as bm25s' default r"(?u)\b\w\w+\b"
PATTERN = rf"(?u)[{UNSPACED}]|[^\W{UNSPACED}]{{2,}}"
TOKENIZATION = {"lower": True, "pattern": PATTERN, "stopwords": "en", "stemmer": "snowball-english"}
# bm25s' default pattern, which shards built before the CJK tokens (and before a shard recorded its own) used
BEFORE_CJK = {**TOKENIZATION, "pattern": r"(?u)\b\w\w+\b"}
RECORD = "ragsift_tokenization.json"  # in a shard's bm25/: how it was tokenized, so queries are tokenized alike


def tokenize(texts: list[str], return_ids: bool = True, pattern: str = PATTERN):
    import bm25s
    import Stemmer

    return bm25s.tokenize(texts, lower=True, token_pattern=pattern, stopwords="en", stemmer=Stemmer.Stemmer("english"),
                          return_ids=return_ids, show_progress=False)


def built_tokenization(shard_dir: str | Path) -> dict:
    """How the shard's BM25 index was tokenized: its own record; for a shard built before shards kept one, its
    index manifest's (recorded since 2026-11-22), else bm25s' default pattern. A query tokenized otherwise
    (an index built before Chinese / Japanese characters became tokens, read by this code) matched nothing."""
    saved = Path(shard_dir) / "bm25" / RECORD
    try:
        return json.loads(saved.read_text())
    except FileNotFoundError:
        pass
    try:
        recorded = (json.loads((Path(shard_dir).parent / "manifest.json").read_text()).get("bm25") or {}).get("tokenization")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return recorded if isinstance(recorded, dict) else BEFORE_CJK


def build_bm25(texts: list[str], out_dir: Path, k1: float, b: float) -> bool:
    """Build and save the shard's BM25 index; False (nothing saved) when its passages hold no word
    (stopwords, punctuation, one-letter words): bm25s cannot index an empty vocabulary, and such a
    shard finds nothing, like an empty one."""
    import bm25s

    tokens = tokenize(texts)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RECORD).write_text(json.dumps(TOKENIZATION))
    if not tokens.vocab:  # a marker, so that a shard copied without its bm25/ still fails loudly
        (out_dir / NO_WORDS).touch()
        return False
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(tokens, show_progress=False)
    retriever.save(str(out_dir), show_progress=False)
    return True


class BM25Shard:
    """A shard's BM25 index; the dense shard actor holds one next to its FAISS index (one passage store)."""

    def __init__(self, shard_dir: str, store: PassageStore | None = None):
        import bm25s

        self.store = store or PassageStore(shard_dir)
        saved = Path(shard_dir) / "bm25"  # none for a shard without passages; a marker for one without words
        self.index = (bm25s.BM25.load(str(saved), mmap=True, show_progress=False)
                      if len(self.store) and not (saved / NO_WORDS).exists() else None)
        built = built_tokenization(shard_dir)
        if {k: v for k, v in built.items() if k != "pattern"} != {k: v for k, v in TOKENIZATION.items() if k != "pattern"}:
            raise ValueError(f"{shard_dir}: its BM25 index was tokenized as {built}, which this ragsift cannot reproduce "
                             "for queries; rebuild the index with `ragsift index`")
        self.pattern = built["pattern"]  # the shard's own: queries tokenized otherwise would not match its tokens

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        out = []
        for tokens in tokenize(queries, return_ids=False, pattern=self.pattern):
            if not tokens or self.index is None:  # only stopwords / no text: nothing can match
                out.append([])
                continue
            rows, scores = self.index.retrieve([tokens], k=min(k, len(self.store)), show_progress=False, n_threads=1)
            hits = [(int(r), float(s)) for r, s in zip(rows[0], scores[0]) if s > 0]
            out.append(self.store.passages([r for r, _ in hits], [s for _, s in hits]))
        return out
