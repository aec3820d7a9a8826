"""The frozen 003 fixtures: two corpora of three tenants each, their labelled queries and catalogue entries."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
CORPUS_FILE = HERE / "corpus.json"
QUERIES_FILE = HERE / "queries.json"
CATALOGUE_FILE = HERE / "catalogue.json"
TENANTS = ("atlas", "boreal", "cinder")
# The second corpus was written apart from the first: another domain, other tenants, its own thesaurus.
CORPORA = {"policies": HERE, "clinics": HERE / "clinics"}


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


def fixture_digest(directory: Path = HERE) -> str:
    """SHA-256 over a corpus's fixture files, so a result names the exact inputs it was computed from."""
    h = hashlib.sha256()
    for name in ("corpus.json", "queries.json", "catalogue.json"):
        h.update((directory / name).read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Corpus:
    """One corpus: documents, queries, and the catalogue entry (routes, rewrite rules) its bundle ships."""

    name: str
    docs: tuple[Doc, ...]
    queries: tuple[Query, ...]
    tenants: tuple[str, ...]
    routes: dict
    rewrites: list
    digest: str


def load_corpus(name: str) -> Corpus:
    """A corpus by name, from its directory."""
    directory = CORPORA[name]
    docs = load_docs(directory / "corpus.json")
    catalogue = orjson.loads((directory / "catalogue.json").read_bytes())
    return Corpus(name, docs, load_queries(directory / "queries.json"), tuple(sorted({d.tenant for d in docs})),
                  catalogue["routes"], catalogue["rewrites"], fixture_digest(directory))
