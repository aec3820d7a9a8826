"""The 003 protocol's deterministic retrieval parts: tokens, scope guard, router and weighted lexical score."""

from __future__ import annotations

import re
import unicodedata
from typing import Sequence

from bench.quality.fixtures import TENANTS, Doc

TOP_K = 3
SUPPORT_THRESHOLD = 4
TITLE_WEIGHT, KEYWORD_WEIGHT, BODY_WEIGHT = 3, 2, 1
# Question words and glue carry no topic; counting them would reward any long document.
STOPWORDS = frozenset(
    "a an the is are was be do does did what which who whom when where why how much many can could should "
    "must may i we our my you your it its of to in into on for from with and or after before get gets "
    "s t that this there their they them".split())
ROUTE_HINTS = {
    "finance": {"meal", "dinner", "supper", "expense", "invoice", "invoices", "vendor", "cap", "allowance",
                "reimbursement"},
    "people": {"leave", "pto", "parental", "vacation", "hire", "new", "onboarding", "parents", "insurance",
               "benefit"},
    "security": {"mfa", "login", "factor", "authentication", "key", "secret", "rotate", "rotation", "password"},
    "reliability": {"api", "429", "endpoint", "throttled", "incident", "p1", "severity", "outage", "paged",
                    "backoff", "retry"},
    "governance": {"data", "customer", "deletion", "deleted", "erased", "records", "audit", "logs", "log",
                   "retained", "retention", "residency", "reside", "termination"},
    "access": {"access", "systems", "production", "write", "leaver", "offboarding", "disabled", "grant"},
}


def normalise(text: str) -> str:
    """NFKC and case-folded, so that look-alike and upper-case spellings compare equal."""
    return unicodedata.normalize("NFKC", text).casefold()


def tokens(text: str) -> list[str]:
    """Alphanumeric terms of the normalised text, stopwords removed."""
    return [t for t in re.findall(r"[a-z0-9]+", normalise(text)) if t not in STOPWORDS]


def mentioned_tenants(text: str) -> list[str]:
    """Known tenant names the text names as whole identifiers (boreal's yes, Borealis no)."""
    low = normalise(text)
    return [t for t in TENANTS if re.search(rf"(?<![a-z0-9]){t}(?![a-z0-9])", low)]


def out_of_scope(text: str, tenant: str) -> list[str]:
    """Tenants other than the caller's that the query names: any one stops the query before retrieval."""
    return [t for t in mentioned_tenants(text) if t != tenant]


def route(text: str) -> str | None:
    """The route with most hint words; None on a tie, so no alphabetical guess passes for certainty."""
    words = tokens(text)
    counts = {name: sum(w in hints for w in words) for name, hints in ROUTE_HINTS.items()}
    best = max(counts.values())
    winners = [name for name, n in counts.items() if n == best]
    return winners[0] if best > 0 and len(winners) == 1 else None


def score(text: str, doc: Doc) -> int:
    """Each distinct query term scores 3 in the title, 2 in the keywords and 1 in the body."""
    title, keywords, body = set(tokens(doc.title)), set(tokens(" ".join(doc.keywords))), set(tokens(doc.body))
    return sum(TITLE_WEIGHT * (t in title) + KEYWORD_WEIGHT * (t in keywords) + BODY_WEIGHT * (t in body)
               for t in set(tokens(text)))


def rank(text: str, docs: Sequence[Doc], k: int = TOP_K) -> list[tuple[Doc, int]]:
    """Positively scored documents, best first (ties by id), at most k."""
    scored = [(d, score(text, d)) for d in docs]
    return sorted([p for p in scored if p[1] > 0], key=lambda p: (-p[1], p[0].id))[:k]
