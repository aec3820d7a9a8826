"""freshplan as a 003 contender: the corpus as catalog records, each query through compiler.pipeline."""

from __future__ import annotations

from typing import Sequence

import orjson

from bench.quality.contenders import event
from bench.quality.fixtures import TENANTS, Doc, Query
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
CEDAR = """// An analyst may use the policy documents of their own tenant only.
permit(principal, action == Action::"use", resource)
when { resource has tenant && principal has tenant && resource.tenant == principal.tenant };
"""


def resource_of(doc: Doc) -> Resource:
    """The catalog record of a document: text and tenant only, never its answer keys."""
    return Resource(id=doc.id, version=1, entity=doc.tenant, evidence_class=EVIDENCE_CLASS,
                    tokens=len(doc.body.split()) + len(doc.keywords) + len(doc.title.split()),
                    title=doc.title, content=f"{doc.body} Keywords: {', '.join(doc.keywords)}.",
                    supports=(PROPOSITION,), provenance_group=doc.id, attributes={"tenant": doc.tenant})


class CorpusCatalog:
    """A read-only CatalogView over the corpus: one entity and one analyst per tenant, one bundle."""

    def __init__(self, docs: Sequence[Doc]) -> None:
        bundle = {"event_id": "quality-003-bundle", "schema_version": 1, "occurred_at": DECISION_TIME,
                  "bundle_id": "quality-003", "version": 1, "effective_at": "2026-01-01T00:00:00Z",
                  "cedar": CEDAR, "decision_types": {DECISION: {"purposes": [PURPOSE], "propositions": [
                      {"id": PROPOSITION, "accepted_classes": [EVIDENCE_CLASS], "required": True,
                       "min_independent": 1}]}}}
        payload = decode("policy-versions", None, orjson.dumps(bundle)).payload
        self._contract = (payload.contracts[0], compile_policy(payload))
        self.resources = {d.id: resource_of(d) for d in docs}
        self.entities = {t: Entity(t, (t.title(),)) for t in TENANTS}
        self.principals = {f"analyst-{t}": Principal(f"analyst-{t}", ("analyst",), {"tenant": t}, 1)
                           for t in TENANTS}

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
        return {}  # the corpus names no source rules

    def candidates(self, entity_id: str, contract: Contract) -> list[Resource]:
        return sorted((r for r in self.resources.values() if r.entity == entity_id), key=lambda r: r.id)


def request_of(query: Query) -> dict:
    """The select body an integration would send: the caller's tenant as entity, the text as query."""
    return {"decision_type": DECISION, "principal": f"analyst-{query.tenant}", "purpose": PURPOSE,
            "entity": query.tenant, "decision_time": DECISION_TIME, "query": query.text}


def freshplan(query: Query, docs: Sequence[Doc], catalog: CorpusCatalog) -> dict:
    """One compile per query; SUFFICIENT answers with the admitted documents' facts, anything else abstains."""
    by_id = {d.id: d for d in docs}
    try:
        plan = compile_request(request_of(query), catalog, None).plan
    except RequestError as exc:   # a refusal is an abstention, charged like a stop before retrieval
        return {"decision": "abstain", "facts": [], "retrieved": [], "route": None, "retrieval_steps": 0,
                "stop_reason": f"refused:{exc.code}", "state": None, "events": [event("decide", outcome="abstain")]}
    admitted = [a["resource_id"] for a in plan["admitted"]]
    stop = plan["stop_reason"]
    if stop == "out_of_scope":
        events = [event("scope_guard", stop=stop)]
        steps = 0
    else:
        events = [event("retrieve", step=1, query=query.text, route=None, candidates=len(admitted),
                        ranking=[[i, None] for i in admitted])]
        steps = 1
    answer = plan["state"] == "SUFFICIENT"
    events += [event("assess", state=plan["state"], withheld=plan["withheld"]),
               event("decide", outcome="answer" if answer else "abstain")]
    facts = sorted({f for i in admitted if i in by_id for f in by_id[i].facts}) if answer else []
    return {"decision": "answer" if answer else "abstain", "facts": facts, "retrieved": admitted, "route": None,
            "retrieval_steps": steps, "stop_reason": stop, "state": plan["state"], "events": events}
