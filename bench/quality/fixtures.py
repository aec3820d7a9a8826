"""The frozen 003 fixtures: 39 policy documents of three tenants and 24 labelled queries."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
CORPUS_FILE = HERE / "corpus.json"
QUERIES_FILE = HERE / "queries.json"
TENANTS = ("atlas", "boreal", "cinder")


@dataclass(frozen=True)
class Doc:
    """One synthetic policy document."""

    id: str
    """Document id, prefixed by its tenant."""
    tenant: str
    """The only tenant allowed to see it."""
    route: str
    """finance, people, security, reliability, governance or access."""
    title: str
    """Short title (weighted 3 by the lexical scorer)."""
    keywords: tuple[str, ...]
    """Index keywords (weighted 2)."""
    body: str
    """The policy text (weighted 1)."""
    facts: tuple[str, ...]
    """Frozen answer keys this document states; read only to form an answer and to judge."""


@dataclass(frozen=True)
class Query:
    """One frozen question with its label."""

    id: str
    """Query id (q01 to q24)."""
    tenant: str
    """The authenticated tenant asking."""
    text: str
    """What the user typed."""
    expected_route: str | None
    """The route a correct router picks; None when no route is right."""
    expected: str
    """answer or abstain."""
    expected_facts: tuple[str, ...]
    """The exact fact set a correct answer returns (empty when abstaining)."""
    relevant: tuple[str, ...]
    """Documents an answer must rest on."""
    why: str
    """What the query tests."""


def load_docs(path: Path = CORPUS_FILE) -> tuple[Doc, ...]:
    """The corpus file as documents."""
    rows = orjson.loads(path.read_bytes())["documents"]
    return tuple(Doc(r["id"], r["tenant"], r["route"], r["title"], tuple(r["keywords"]), r["body"],
                     tuple(r["facts"])) for r in rows)


def load_queries(path: Path = QUERIES_FILE) -> tuple[Query, ...]:
    """The query file as queries."""
    rows = orjson.loads(path.read_bytes())["queries"]
    return tuple(Query(r["id"], r["tenant"], r["text"], r["expected_route"], r["expected"],
                       tuple(r["expected_facts"]), tuple(r["relevant"]), r["why"]) for r in rows)


def fixture_digest() -> str:
    """SHA-256 over both fixture files, so a result names the exact inputs it was computed from."""
    h = hashlib.sha256()
    for path in (CORPUS_FILE, QUERIES_FILE):
        h.update(path.read_bytes())
    return h.hexdigest()
