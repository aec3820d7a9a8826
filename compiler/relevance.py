"""BM25 relevance of candidates to the query text: orders within slots, never admits."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric terms."""
    return _TOKEN.findall(text.lower())


def bm25(query: str, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 of each document against the query, over this candidate set."""
    terms = set(tokenize(query))
    if not terms or not documents:
        return [0.0] * len(documents)
    docs = [Counter(tokenize(d)) for d in documents]
    lengths = [sum(d.values()) for d in docs]
    avg = (sum(lengths) / len(docs)) or 1.0
    n = len(docs)
    scores = []
    for doc, length in zip(docs, lengths, strict=True):
        score = 0.0
        for term in terms:
            tf = doc.get(term, 0)
            if not tf:
                continue
            df = sum(1 for d in docs if term in d)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg))
        scores.append(score)
    return scores
