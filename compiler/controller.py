"""The adaptive retrieval controller: route, retrieve, assess, rewrite by public rules, retrieve again, stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from compiler.relevance import bm25, query_terms, tokenize
from schemas.records import Contract, Resource

SUPPORT_SUFFICIENT = "support_sufficient"
RETRIEVAL_BUDGET = "retrieval_budget"
TRANSITION_BUDGET = "transition_budget"
NO_REWRITE = "no_rewrite"
LOOP_DETECTED = "loop_detected"
NO_QUESTION = "no_question"
ROUTE_ATTRIBUTE = "route"
# A document that shares under half of what a question asks about is near it, not an answer
# to it (the 003 seed's P1-logs and EU-residency misses share one or two words of four or five).
DEFAULT_COVERAGE = 0.5


@dataclass(frozen=True)
class Rule:
    """An explicit rewrite: when the query has any phrase of `when`, add `add` (and drop the phrase if asked).

    Phrases and added words are held as the terms relevance scores (`no-show` is `no` and `show`),
    so a rule matches whatever punctuation or inflection the question used.
    """

    when: tuple[frozenset[str], ...]
    add: frozenset[str]
    drop: bool = False

    def matches(self, terms: frozenset[str]) -> list[frozenset[str]]:
        """The rule's phrases whose every term the query has."""
        return [p for p in self.when if p and p <= terms]


def rule(when: Sequence[str], add: Sequence[str], drop: bool = False) -> Rule:
    """A rule from catalogue words."""
    return Rule(tuple(query_terms(w) for w in when), frozenset().union(*(query_terms(w) for w in add)), drop)


@dataclass(frozen=True)
class Settings:
    """A decision type's controller, as its catalogue entry states it."""

    routes: tuple[tuple[str, frozenset[str]], ...] = ()
    rules: tuple[Rule, ...] = ()
    max_retrievals: int = 2
    max_transitions: int = 9
    per_retrieval: int | None = 3
    """Candidates kept per retrieval; None keeps every positively scored one."""
    min_coverage: float = 0.0
    """Share of the question's own terms a candidate must contain, itself or through a rule's words."""


# Without a controller in the catalogue a plan is one retrieval over every admitted candidate.
ONE_SHOT = Settings(max_retrievals=1, per_retrieval=None)


def settings_of(contract: Contract) -> Settings:
    """The controller a contract declares, or one retrieval when it declares none."""
    doc: Mapping[str, Any] | None = contract.controller
    if doc is None:
        return ONE_SHOT
    routes = tuple(sorted((name, frozenset().union(*(query_terms(w) for w in hints))) for name, hints in
                          (doc.get("routes") or {}).items()))
    rules = tuple(rule(r["when"], r["add"], bool(r.get("drop", False))) for r in doc.get("rewrites") or ())
    return Settings(routes, rules, int(doc.get("max_retrievals", 2)), int(doc.get("max_transitions", 9)),
                    int(doc.get("candidates_per_retrieval", 3)), float(doc.get("min_coverage", DEFAULT_COVERAGE)))


@dataclass
class Outcome:
    """What the controller retrieved, why it stopped, and the trace of how."""

    retrieved: tuple[tuple[Resource, float], ...] = ()
    """The last retrieval's candidates with their scores, best first."""
    relevant: tuple[Resource, ...] = ()
    """Those of them above the threshold that cover enough of the question: what it may rest on."""
    sufficient: bool = False
    """Whether the last assessment found relevant support."""
    stop: str = NO_QUESTION
    retrievals: int = 0
    scored: int = 0
    """Candidates scored over all retrievals (what a retrieval costs)."""
    trace: list[dict] = field(default_factory=list)


def route(terms: frozenset[str], routes: Sequence[tuple[str, frozenset[str]]]) -> str | None:
    """The route with most hint words in the query; a tie or no hint routes nowhere (never alphabetically)."""
    counts = [(len(terms & hints), name) for name, hints in routes]
    best = max((n for n, _ in counts), default=0)
    winners = [name for n, name in counts if n == best]
    return winners[0] if best > 0 and len(winners) == 1 else None


Stands = dict[str, frozenset[str]]


def rewrite(terms: frozenset[str], rules: Sequence[Rule]) -> tuple[frozenset[str], list[int], Stands]:
    """The query's terms after every rule that matches and changes them, which rules fired, and
    for each matched term the words the rules stand in for it."""
    out, fired, stands = set(terms), [], {}
    for i, r in enumerate(rules):
        phrases = r.matches(terms)
        if not phrases:
            continue
        after = (out - frozenset().union(*phrases) if r.drop else out) | r.add
        if after != out:
            out, fired = after, fired + [i]
            for term in frozenset().union(*phrases):
                stands[term] = stands.get(term, frozenset()) | r.add
    return frozenset(out), fired, stands


def coverage(asked: frozenset[str], words: set[str], stands: Mapping[str, frozenset[str]]) -> float:
    """Share of the question's terms a document contains, itself or through a word a rule put for it."""
    if not asked:
        return 0.0
    return sum(1 for t in asked if t in words or stands.get(t, frozenset()) & words) / len(asked)


def _text(resource: Resource) -> str:
    return f"{resource.title} {resource.content}"


def run(query: str, pool: Sequence[Resource], settings: Settings, threshold: float | None) -> Outcome:
    """Drive the state machine over already authorised candidates.

    `threshold` is the BM25 the best candidate needs for support to be sufficient (None: any
    positive score). Scoring statistics come from the whole pool, so a routed subset keeps the
    collection's scale; only the candidates of the route are scored and charged.
    """
    terms = asked = query_terms(query)
    outcome = Outcome()
    if not terms:
        return outcome
    texts = [_text(r) for r in pool]
    seen = {terms}
    stands: dict[str, frozenset[str]] = {}
    transitions = 0

    def step(event: dict) -> bool:
        nonlocal transitions
        if transitions >= settings.max_transitions:
            outcome.stop = TRANSITION_BUDGET
            return False
        transitions += 1
        outcome.trace.append(event)
        return True

    while True:
        chosen = route(terms, settings.routes)
        if not step({"step": "route", "terms": sorted(terms), "route": chosen}):
            break
        members = [i for i, r in enumerate(pool) if chosen is None
                   or r.attributes.get(ROUTE_ATTRIBUTE) in (None, chosen)]
        scores = bm25(terms, [texts[i] for i in members], pool=texts)
        ranked = sorted(((pool[i], s) for i, s in zip(members, scores, strict=True) if s > 0),
                        key=lambda p: (-p[1], p[0].id))
        kept = tuple(ranked if settings.per_retrieval is None else ranked[:settings.per_retrieval])
        if not step({"step": "retrieve", "n": outcome.retrievals + 1, "route": chosen, "candidates": len(members),
                     "ranking": [{"resource_id": r.id, "rank": k + 1, "score": round(s, 3)}
                                 for k, (r, s) in enumerate(kept)]}):
            break
        outcome.retrievals += 1
        outcome.scored += len(members)
        outcome.retrieved = kept
        top = kept[0][1] if kept else 0.0
        covered = {r.id: coverage(asked, set(tokenize(_text(r))), stands) for r, _ in kept}
        outcome.relevant = tuple(r for r, s in kept if (threshold is None or s >= threshold)
                                 and covered[r.id] >= settings.min_coverage)
        outcome.sufficient = bool(outcome.relevant)
        if not step({"step": "assess", "top_score": round(top, 3), "threshold": threshold,
                     "coverage": {i: round(v, 3) for i, v in covered.items()},
                     "min_coverage": settings.min_coverage, "sufficient": outcome.sufficient}):
            outcome.sufficient, outcome.relevant = False, ()
            break
        if outcome.sufficient:
            outcome.stop = SUPPORT_SUFFICIENT
            break
        if outcome.retrievals >= settings.max_retrievals:
            outcome.stop = RETRIEVAL_BUDGET
            break
        after, fired, more = rewrite(terms, settings.rules)
        if not fired:
            outcome.stop = NO_REWRITE
            break
        if after in seen:
            outcome.stop = LOOP_DETECTED
            break
        if not step({"step": "rewrite", "rules": fired, "added": sorted(after - terms),
                     "dropped": sorted(terms - after)}):
            break
        seen.add(after)
        terms = after
        for term, words in more.items():
            stands[term] = stands.get(term, frozenset()) | words
    outcome.trace.append({"step": "stop", "reason": outcome.stop, "retrievals": outcome.retrievals,
                          "scored": outcome.scored})
    return outcome
