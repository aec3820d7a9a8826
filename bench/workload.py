"""The generated workload every invalidation-path contender sees: a catalog, plans and a change stream."""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson

T0 = "2026-09-01T00:00:00Z"
ROLE = "analyst"
PURPOSE = "review"
DECISION = "bench.review"
CEDAR = ('permit(principal, action == Action::"use", resource) when { resource has allowed_roles && '
         'resource.allowed_roles.containsAny(principal.roles) };')
Record = tuple[str, bytes | None, bytes]  # (logical topic, key, value)


@dataclass(frozen=True)
class Workload:
    """Catalog events, the plan requests to warm, and the change stream, all from one seed."""

    catalog: list[Record]
    """Policy bundle, principals, entities and resources: the state plans compile against."""
    requests: list[dict]
    """One select body per plan (principal x entity)."""
    changes: list[Record]
    """The measured stream: resource edits, principal edits, revocations, clock ticks."""


def bundle(version: int = 1, event_id: str | None = None) -> Record:
    """The bench policy bundle; a new version invalidates every plan (the fan-out case)."""
    body = {"event_id": event_id or f"bench-bundle-{version}", "schema_version": 1, "occurred_at": T0,
            "bundle_id": "bench", "version": version, "effective_at": "2026-01-01T00:00:00Z", "cedar": CEDAR,
            # Every record is its own source here: the bench measures freshness, so it opts out of trust.
            "source_trust": False,
            "decision_types": {DECISION: {"purposes": [PURPOSE], "propositions": [
                {"id": "limit", "accepted_classes": ["record"], "required": True, "min_independent": 1},
                {"id": "status", "accepted_classes": ["record"], "required": False}]}}}
    return "policy-versions", b"bench", orjson.dumps(body)


def _source(event_id: str, kind: str, body: dict) -> Record:
    return "source-changes", body["id"].encode(), orjson.dumps(
        {"event_id": event_id, "schema_version": 1, "occurred_at": T0, "kind": kind, "op": "upsert", kind: body})


def resource(rid: str, entity: str, version: int, event_id: str, supports: str = "limit",
             tokens: int = 40) -> Record:
    """One evidence record of an entity."""
    return _source(event_id, "resource", {
        "id": rid, "version": version, "entity": entity, "title": rid, "content": f"{rid} v{version}",
        "tokens": tokens, "evidence_class": "record", "supports": [supports], "contradicts": [],
        "valid_from": "2026-01-01T00:00:00Z", "valid_to": None, "provenance_group": rid,
        "sensitivity": "internal", "attributes": {"allowed_roles": [ROLE]}})


def principal(pid: str, event_id: str, unit: int = 0) -> Record:
    """A principal with the bench role."""
    return _source(event_id, "principal", {"id": pid, "roles": [ROLE], "attributes": {"unit": f"u{unit}"},
                                           "delegation_version": 1})


def entity(eid: str, event_id: str) -> Record:
    """An entity without aliases."""
    return _source(event_id, "entity", {"id": eid, "aliases": []})


def request(principal_id: str, entity_id: str) -> dict:
    """The select body of one plan."""
    return {"decision_type": DECISION, "principal": principal_id, "purpose": PURPOSE, "entity": entity_id,
            "budget": {"tokens": 400}}


def generate(*, entities: int = 100, principals: int = 10, plans: int = 200, changes: int = 5000,
             seed: int = 7, prefix: str = "bench-c", version_base: int = 0) -> Workload:
    """A deterministic workload; `plans` requests spread over the principal x entity grid.

    The change stream is 70% edits of resources (a quarter of them on entities no plan uses,
    some only touching a resource the budget leaves out), 20% principal edits that change
    nothing a plan uses, 5% revocations of principals no plan belongs to and 5% clock ticks.
    """
    rng = random.Random(seed)
    catalog: list[Record] = [bundle()]
    catalog += [principal(f"u{i}", f"bench-u{i}") for i in range(principals + 20)]
    catalog += [entity(f"E{i}", f"bench-e{i}") for i in range(entities)]
    versions: dict[str, int] = {}
    for i in range(entities):
        for j in range(4):
            rid = f"E{i}-r{j}"
            versions[rid] = 1
            catalog.append(resource(rid, f"E{i}", 1, f"bench-{rid}-1", "limit" if j < 3 else "status",
                                    tokens=40 + 40 * j))
    catalog.append(("clock", None, orjson.dumps({"event_id": "bench-t0", "schema_version": 1, "occurred_at": T0,
                                                "now": "2026-09-01T00:00:00Z"})))
    grid = [(f"u{p}", f"E{e}") for e in range(entities) for p in range(principals)]
    rng.shuffle(grid)
    requests = [request(p, e) for p, e in grid[:plans]]
    planned = sorted({r["entity"] for r in requests})
    stream: list[Record] = []
    tick = 0
    for n in range(changes):
        roll = rng.random()
        if roll < 0.70:
            hot = rng.random() < 0.75 and planned
            ent = rng.choice(planned) if hot else f"E{rng.randrange(entities)}"
            rid = f"{ent}-r{rng.randrange(4)}"
            versions[rid] = max(versions.get(rid, 1), version_base) + 1
            stream.append(resource(rid, ent, versions[rid], f"{prefix}{n}", "limit" if rid[-1] < "3" else "status",
                                   tokens=40 + 40 * int(rid[-1])))
        elif roll < 0.90:
            stream.append(principal(f"u{rng.randrange(principals)}", f"{prefix}{n}", unit=n))
        elif roll < 0.95:
            victim = f"u{principals + rng.randrange(20)}"
            stream.append(("revocations", victim.encode(), orjson.dumps(
                {"event_id": f"{prefix}{n}", "schema_version": 1, "occurred_at": T0, "principal": victim,
                 "revoke": "session", "value": f"s{n}", "effective_at": T0, "issued_by": "bench"})))
        else:
            tick += 1
            stream.append(("clock", None, orjson.dumps(
                {"event_id": f"{prefix}t{tick}", "schema_version": 1, "occurred_at": T0,
                 "now": f"2026-09-01T{1 + version_base // 1_000_000:02d}:{tick // 60 % 60:02d}:{tick % 60:02d}Z"})))
    return Workload(catalog, requests, stream)


def quiet(entities: int, principals: int = 10, prefix: str = "Q") -> tuple[list[Record], list[dict]]:
    """Entities no stream of `generate` edits (4 resources each, as its own) and a request per principal and entity.

    Their plans stay fresh while such a stream applies, so every select of one is a cache hit: what
    the cached-select row times. The workload's own plans are mostly invalidated by the stream (and
    compiled again when asked), which left that row a few dozen hits, whose p99 was their maximum.
    """
    catalog: list[Record] = []
    for i in range(entities):
        catalog.append(entity(f"{prefix}{i}", f"quiet-{prefix}{i}"))
        catalog += [resource(f"{prefix}{i}-r{j}", f"{prefix}{i}", 1, f"quiet-{prefix}{i}-r{j}",
                             "limit" if j < 3 else "status", tokens=40 + 40 * j) for j in range(4)]
    return catalog, [request(f"u{p}", f"{prefix}{i}") for i in range(entities) for p in range(principals)]


def apply_catalog(invalidator, records: list[tuple[str, bytes | None, bytes]]) -> None:
    """Apply (topic, key, value) records through an `EventApplier`, numbered per topic as a broker would."""
    from agents.stream.raw_message import RawMessage

    offsets: dict[str, int] = {}
    messages = []
    for topic, key, value in records:
        offsets[topic] = offsets.get(topic, -1) + 1
        messages.append(RawMessage(topic, 0, offsets[topic], key, value))
    invalidator.apply(messages)


def warm_in_process(state, workload: Workload, events: int | None = None):
    """An `EventApplier` on `state` with the workload's catalog applied and every request selected, and the change
    stream (its first `events`) as messages numbered per topic after the catalog, as a broker would number them."""
    from agents.plans.plan_writer import PlanWriter
    from agents.stream.event_apply import EventApplier
    from agents.stream.raw_message import RawMessage
    from agents.web.query import QueryService

    applier = EventApplier(state, PlanWriter(state, lambda name: name))
    offsets: dict[str, int] = {}

    def message(record: Record) -> RawMessage:
        topic, key, value = record
        offsets[topic] = offsets.get(topic, -1) + 1
        return RawMessage(topic, 0, offsets[topic], key, value)

    applier.apply([message(r) for r in workload.catalog])
    query = QueryService(state, applier.plans)
    for body in workload.requests:
        query.select(body)
    return applier, [message(r) for r in workload.changes[:events]]


def bulk(resources: int, per_entity: int = 10, prefix: str = "B") -> list[Record]:
    """Entities no plan is about, with `per_entity` resources each: state that splits by entity and nothing else."""
    records: list[Record] = []
    for i in range(-(-resources // per_entity)):
        records.append(entity(f"{prefix}{i}", f"bulk-{prefix}{i}"))
        for j in range(min(per_entity, resources - i * per_entity)):
            rid = f"{prefix}{i}-r{j}"
            records.append(resource(rid, f"{prefix}{i}", 1, f"bulk-{rid}-1", "status"))
    return records
