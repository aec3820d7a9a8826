"""A 003 corpus as the service's input events, so one pass can run through a live worker."""

from __future__ import annotations

from bench.quality.fixtures import Corpus
from bench.quality.freshplan_run import DECISION_TIME, bundle_of, resource_of
from schemas.timefmt import format_instant


def _event(event_id: str, **body) -> dict:
    return {"event_id": event_id, "schema_version": 1, "occurred_at": DECISION_TIME, **body}


def corpus_events(corpus: Corpus, mode: str = "adaptive", version: int = 1) -> list[tuple[str, dict]]:
    """(topic, event) pairs giving a worker the state `CorpusCatalog` gives the compiler in process."""
    bundle = dict(bundle_of(corpus, mode), version=version, event_id=f"quality-{corpus.name}-{mode}-v{version}")
    out: list[tuple[str, dict]] = [("policy-versions", bundle)]
    for t in corpus.tenants:
        out.append(("source-changes", _event(f"{corpus.name}-entity-{t}", kind="entity", op="upsert",
                                             entity={"id": t, "aliases": [t.title()]})))
        out.append(("source-changes", _event(f"{corpus.name}-analyst-{t}", kind="principal", op="upsert", principal={
            "id": f"analyst-{t}", "roles": ["analyst"], "attributes": {"tenant": t}, "delegation_version": 1})))
    for doc in corpus.docs:
        out.append(("source-changes", _event(f"{corpus.name}-doc-{doc.id}", kind="resource", op="upsert",
                                             resource=resource_body(resource_of(doc)))))
    return out


def resource_body(r) -> dict:
    """A Resource record back in its wire shape."""
    def instant(t):
        return t and format_instant(t)
    return {"id": r.id, "version": r.version, "entity": r.entity, "title": r.title, "content": r.content,
            "tokens": r.tokens, "evidence_class": r.evidence_class, "supports": list(r.supports),
            "contradicts": list(r.contradicts), "valid_from": instant(r.valid_from), "valid_to": instant(r.valid_to),
            "superseded_by": r.superseded_by, "provenance_group": r.provenance_group,
            "sensitivity": r.sensitivity, "attributes": dict(r.attributes)}
