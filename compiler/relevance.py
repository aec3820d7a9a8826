"""BM25 relevance of candidates to the query text: ranks within slots and decides what a question can rest on."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

_TOKEN = re.compile(r"[a-z0-9]+")
# Question words and glue: a document that shares only these with a question does not answer it,
# and counting them would make every document look a little relevant to every question.
STOPWORDS = frozenset(
    "a an the is are was were be been being do does did done what which who whom whose when where why how "
    "much many can could should shall must may might will would i we our ours my me you your it its of to "
    "in into on at for from with and or nor by after before get gets got that this these those there their "
    "they them so if than as any all s t".split()
    # Temporal prepositions and conjunctions are glue of the same kind as `after` and `before`.
    + "until till while during since".split())


def stem(word: str) -> str:
    """A light suffix stripper, so that `refunded`, `refunds` and `refund` are one term.

    Only plural, past and gerund endings and a final e: enough to join a question's inflection
    to a document's, too little to merge different words (a full stemmer is not needed here).
    """
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            word = word[:-len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric terms, lightly stemmed."""
    return [stem(t) for t in _TOKEN.findall(text.lower())]


def query_terms(query: str) -> frozenset[str]:
    """The terms of a question that carry its topic (stopwords dropped before stemming)."""
    return frozenset(stem(t) for t in _TOKEN.findall(query.lower()) if t not in STOPWORDS)


def bm25(query: str | frozenset[str], documents: Sequence[str], k1: float = 1.2, b: float = 0.75,
         pool: Sequence[str] | None = None) -> list[float]:
    """Okapi BM25 of each document against the query's topic terms.

    Term and length statistics come from `pool` (default: the documents themselves), so a
    subset scored on its own keeps the scale of the collection it was drawn from.
    """
    terms = query if isinstance(query, frozenset) else query_terms(query)
    if not terms or not documents:
        return [0.0] * len(documents)
    stats = [Counter(tokenize(d)) for d in (documents if pool is None else pool)]
    docs = [Counter(tokenize(d)) for d in documents] if pool is not None else stats
    avg = (sum(sum(d.values()) for d in stats) / len(stats)) if stats else 1.0
    avg = avg or 1.0
    n = max(len(stats), 1)
    idf = {}
    for term in terms:
        df = sum(1 for d in stats if term in d)
        idf[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    scores = []
    for doc in docs:
        length = sum(doc.values())
        score = 0.0
        for term in terms:
            tf = doc.get(term, 0)
            if tf:
                score += idf[term] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg))
        scores.append(score)
    return scores
