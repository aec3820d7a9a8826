"""freshplan as a 003 contender: a corpus as catalog records, each query through the real compiler."""

from __future__ import annotations

import re
from typing import Sequence

import orjson

from bench.quality.contenders import event
from bench.quality.fixtures import Corpus, Doc, Query
from compiler.errors import RequestError
from compiler.pipeline import compile_request
from compiler.policy import compile_policy
from schemas.codec import decode
from schemas.records import Contract, Entity, Principal, Resource

DECISION = "policy.answer"
PURPOSE = "policy_question"
PROPOSITION = "policy_stated"
EVIDENCE_CLASS = "policy_document"
DECISION_TIME = "2026-07-15T00:00:00Z"
# One threshold for every corpus: about two distinctive terms' worth of BM25 (a single rare term
# scores near 2.2 in a collection of a dozen documents), so one shared word never answers.
MIN_RELEVANCE = 4.0
CEDAR = """// An analyst may use the policy documents of their own tenant only.
permit(principal, action == Action::"use", resource)
when { resource has tenant && principal has tenant && resource.tenant == principal.tenant };
// ... and may ask about their own tenant only: any other is out of scope before retrieval.
permit(principal, action == Action::"ask", resource)
when { principal has tenant && resource has id && resource.id == principal.tenant };
"""
MODES = ("fixed_one_shot", "adaptive")


def resource_of(doc: Doc) -> Resource:
    """The catalog record of a document: text, tenant and route only, never its answer keys."""
    return Resource(id=doc.id, version=1, entity=doc.tenant, evidence_class=EVIDENCE_CLASS,
                    tokens=len(doc.body.split()) + len(doc.keywords) + len(doc.title.split()),
                    title=doc.title, content=f"{doc.body} Keywords: {', '.join(doc.keywords)}.",
                    supports=(PROPOSITION,), provenance_group=doc.id,
                    attributes={"tenant": doc.tenant, "route": doc.route})


def controller_of(corpus: Corpus, mode: str) -> dict:
    """The catalogue's controller: fixed one-shot routes once and retrieves once, adaptive may rewrite."""
    if mode == "fixed_one_shot":
        return {"routes": corpus.routes, "rewrites": [], "max_retrievals": 1}
    return {"routes": corpus.routes, "rewrites": corpus.rewrites}


def bundle_of(corpus: Corpus, mode: str) -> dict:
    """The policy-versions event of one contender, validated as the service would validate it."""
    return {"event_id": f"quality-{corpus.name}-{mode}", "schema_version": 1, "occurred_at": DECISION_TIME,
            "bundle_id": f"quality-{corpus.name}", "version": 1, "effective_at": "2026-01-01T00:00:00Z",
            "cedar": CEDAR, "sources": {d.id: [EVIDENCE_CLASS] for d in corpus.docs},
            "decision_types": {DECISION: {
                "purposes": [PURPOSE], "min_relevance": MIN_RELEVANCE, "controller": controller_of(corpus, mode),
                "ask_scope": True,
                "propositions": [{"id": PROPOSITION, "accepted_classes": [EVIDENCE_CLASS], "required": True,
                                  "min_independent": 1}]}}}


class CorpusCatalog:
    """A read-only CatalogView over a corpus: one entity and one analyst per tenant, one bundle."""

    def __init__(self, corpus: Corpus, mode: str = "adaptive") -> None:
        payload = decode("policy-versions", None, orjson.dumps(bundle_of(corpus, mode))).payload
        self._contract = (payload.contracts[0], compile_policy(payload))
        self._sources = payload.sources
        self.resources = {d.id: resource_of(d) for d in corpus.docs}
        self.entities = {t: Entity(t, (t.title(),)) for t in corpus.tenants}
        self.principals = {f"analyst-{t}": Principal(f"analyst-{t}", ("analyst",), {"tenant": t}, 1)
                           for t in corpus.tenants}

    def entity_matches(self, name: str) -> list[str]:
        low = name.lower()
        return [e.id for e in self.entities.values() if e.id == name or low in (a.lower() for a in e.aliases)]

    def principal(self, principal_id: str) -> Principal | None:
        return self.principals.get(principal_id)

    def contract(self, decision_type: str, at=None):
        return self._contract if decision_type == DECISION else None

    def decision_types(self) -> list[str]:
        return [DECISION]

    def entities_named(self, names: Sequence[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name in names:
            low = name.lower()
            ids = sorted(e.id for e in self.entities.values() if low in {e.id.lower(), *(a.lower() for a in e.aliases)})
            if ids:
                out[name] = ids
        return out

    def trusted_sources(self) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for group, classes in self._sources.items():
            for cls in classes:
                out.setdefault(cls, set()).add(group)
        return {cls: frozenset(groups) for cls, groups in out.items()}

    def candidates(self, entity_id: str, contract: Contract) -> list[Resource]:
        return sorted((r for r in self.resources.values() if r.entity == entity_id), key=lambda r: r.id)


def request_of(query: Query) -> dict:
    """The select body an integration would send: the caller's tenant as entity, the text as query."""
    return {"decision_type": DECISION, "principal": f"analyst-{query.tenant}", "purpose": PURPOSE,
            "entity": query.tenant, "decision_time": DECISION_TIME, "query": query.text}


def charged_events(plan: dict) -> list[dict]:
    """The protocol's events from the compiler's own trace: a retrieval is charged what it scored."""
    if plan["stop_reason"] == "out_of_scope":
        return [event("scope_guard", stop="out_of_scope")]
    out = []
    for e in plan["retrieval"]["trace"]:
        if e["step"] == "retrieve":
            out.append(event("retrieve", step=e["n"], route=e["route"], candidates=e["candidates"],
                             ranking=[[r["resource_id"], r["score"]] for r in e["ranking"]]))
        elif e["step"] in ("route", "assess", "rewrite"):
            out.append(event(e["step"], **{k: v for k, v in e.items() if k != "step"}))
    return out


def leaks(query: Query, corpus: Corpus, channels: Sequence[dict]) -> list[str]:
    """Ids of other tenants' documents in any channel the caller reads (plan, receipt, plan status, ...)."""
    text = orjson.dumps(list(channels)).decode()
    # An id counts wherever it stands whole, quoted or inside a key such as `resource:<id>` in a cause.
    found = [d.id for d in corpus.docs
             if d.tenant != query.tenant and re.search(rf"(?<![\w.-]){re.escape(d.id)}(?![\w.-])", text)]
    return found + (["withheld-count"] if any(c.get("withheld") for c in channels) else [])


def refused(code: str) -> dict:
    """A refusal is an abstention, charged like a stop before retrieval."""
    return {"decision": "abstain", "facts": [], "retrieved": [], "route": None, "retrieval_steps": 0,
            "stop_reason": f"refused:{code}", "state": None, "leaks": [],
            "events": [event("decide", outcome="abstain")]}


def run_of(query: Query, corpus: Corpus, plan: dict, channels: Sequence[dict]) -> dict:
    """A plan read as the contender's run: SUFFICIENT answers with the admitted documents' facts, else abstains.

    `channels` is everything else the caller may read about it (the receipt, the plan's status);
    the plan itself is always looked in for leaks.
    """
    by_id = {d.id: d for d in corpus.docs}
    admitted = [a["resource_id"] for a in plan["admitted"]]
    events = charged_events(plan)
    retrieves = [e for e in events if e["kind"] == "retrieve"]
    routes = [e["route"] for e in events if e["kind"] == "route"]
    answer = plan["state"] == "SUFFICIENT"
    events.append(event("decide", outcome="answer" if answer else "abstain"))
    facts = sorted({f for i in admitted if i in by_id for f in by_id[i].facts}) if answer else []
    return {"decision": "answer" if answer else "abstain", "facts": facts,
            "retrieved": [i for i, _ in retrieves[-1]["ranking"]] if retrieves else [],
            "route": routes[-1] if routes else None, "retrieval_steps": len(retrieves),
            "stop_reason": plan["stop_reason"], "controller_stop": plan["retrieval"]["stop"],
            "state": plan["state"], "leaks": leaks(query, corpus, [plan, *channels]), "events": events}


def freshplan(query: Query, corpus: Corpus, catalog: CorpusCatalog) -> dict:
    """One compile per query, read as a run (`run_of`); a refusal abstains."""
    try:
        compiled = compile_request(request_of(query), catalog, None)
    except RequestError as exc:
        return refused(exc.code)
    return run_of(query, corpus, compiled.plan, [compiled.receipt])
