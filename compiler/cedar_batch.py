"""Cedar decisions for the candidates of many requests: one entity store, one call per policy set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence, cast

import cedarpy
import orjson

from compiler.policy import (Authorisation, CompiledPolicy, Unrepresentable, authorise, denied, principal_entity,
                             request_context, resource_entity, use_request, verdicts)
from schemas.records import Principal, Resource


SHARED_ENTITIES = 500  # entities a batch's shared store grows to before a call starts it afresh


@dataclass(frozen=True)
class Ask:
    """One request's question to Cedar: may this principal `use` each of these resources."""

    policy: CompiledPolicy
    """The bundle version that governs the request."""
    principal: Principal
    """Who asks."""
    resources: Sequence[Resource]
    """The candidates, in the order the verdict follows."""
    purpose: str
    """Context: the request's purpose."""
    decision_type: str
    """Context: the request's decision type."""
    decision_time: datetime
    """Context: the instant decided at."""


class SharedEntities:
    """Entity documents and the parsed Cedar store, kept across the `authorise_many` calls of one batch.

    A batch is asked in chunks (each Cedar call holds the GIL), and its chunks share most
    principals and many resources: each record is converted once and each document parsed
    once, later chunks adding only what is new to the parsed store. Hold one only while the
    records it converted are unchanged (it pins them, so their ids are not reused).
    """

    def __init__(self) -> None:
        self.built: dict[int, tuple[Any, dict | None]] = {}
        """id(record) -> (the record, pinned; its document, None when unrepresentable)."""
        self.store: dict[tuple[str, str], dict] = {}
        """(type, id) -> document of every entity in `entities`."""
        self.entities: Any = None
        """The parsed `store` (a cedarpy Entities handle), None before the first parse."""


@dataclass
class _Group:
    """The requests of one policy set, deduplicated, and where each ask's answers are."""

    policy_set: Any
    requests: list[dict]
    slots: dict[tuple[str, str, str], int]
    members: list[tuple[int, list[int], list[int]]]
    """(ask index, usable candidate indexes, their request slots)."""


def authorise_many(asks: Sequence[Ask], shared: SharedEntities | None = None) -> list[Authorisation]:
    """Each ask's Authorisation, exactly as `authorise` gives it one ask at a time.

    Entity documents are built once and parsed into one store; each distinct policy set is
    asked once for the candidates of all its asks, identical questions asked once. Where
    sharing a store could change an answer (a policy naming an entity literal, two documents
    for one entity id) or the shared call fails, that ask is answered on its own by `authorise`,
    so an error still denies only what it would have denied alone. `shared` carries documents
    and the parsed store over from earlier calls of the same batch.
    """
    shared = shared or SharedEntities()
    out: list[Authorisation | None] = [None] * len(asks)
    store: dict[tuple[str, str], dict] = {}  # every document this call's shared asks use
    groups: dict[int, _Group] = {}
    alone: list[int] = []
    for n, ask in enumerate(asks):
        if not ask.resources:
            out[n] = Authorisation((), ())
            continue
        if not ask.policy.self_contained:
            alone.append(n)
            continue
        user, docs, usable = _documents(ask, shared.built)
        if user is None:
            out[n] = denied(len(ask.resources))
            continue
        mine: dict[tuple[str, str], dict] = {}
        if not all(_merge(mine, doc) and store.get(_uid(doc), shared.store.get(_uid(doc), doc)) == doc
                   for doc in [user, *docs]):
            alone.append(n)
            continue
        store.update(mine)
        group = groups.get(id(ask.policy.policy_set))
        if group is None:
            group = groups[id(ask.policy.policy_set)] = _Group(ask.policy.policy_set, [], {}, [])
        # A string context is what cedarpy would make of the dict, serialised once per ask.
        context = json.dumps(request_context(ask.purpose, ask.decision_type, ask.decision_time))
        slots = []
        for i in usable:
            key = (user["uid"]["id"], ask.resources[i].id, context)
            if key not in group.slots:
                group.slots[key] = len(group.requests)
                group.requests.append(use_request(user, ask.resources[i].id, context))
            slots.append(group.slots[key])
        group.members.append((n, usable, slots))
    entities = _grow(shared, store) if groups else None
    for group in groups.values():
        try:
            if entities is None:
                raise ValueError("the shared entity store did not parse")
            results = cedarpy.is_authorized_batch(group.requests, group.policy_set, entities) if group.requests else []
        except Exception:  # noqa: BLE001 - each ask is then asked alone, failing closed on its own
            alone.extend(n for n, _, _ in group.members)
            continue
        for n, usable, slots in group.members:
            out[n] = verdicts(len(asks[n].resources), usable, [results[s] for s in slots])
    for n in alone:
        ask = asks[n]
        out[n] = authorise(ask.policy, ask.principal, ask.resources, purpose=ask.purpose,
                           decision_type=ask.decision_type, decision_time=ask.decision_time)
    return cast(list[Authorisation], out)  # every ask was answered above


def _documents(ask: Ask, built: dict[int, tuple[Any, dict | None]]) -> tuple[dict | None, list[dict], list[int]]:
    """As `entity_documents`, each principal and resource object converted once per batch."""
    user = _built(built, ask.principal, principal_entity)
    if user is None:
        return None, [], []
    docs, usable = [], []
    for i, resource in enumerate(ask.resources):
        doc = _built(built, resource, resource_entity)
        if doc is not None:
            docs.append(doc)
            usable.append(i)
    return user, docs, usable


def _built(built: dict[int, tuple[Any, dict | None]], record: Any, convert: Any) -> dict | None:
    # Keyed by identity, the record pinned beside its document so that its id is not reused.
    key = id(record)
    if key not in built:
        try:
            built[key] = (record, convert(record))
        except Unrepresentable:
            built[key] = (record, None)
    return built[key][1]


def _uid(doc: dict) -> tuple[str, str]:
    return doc["uid"]["type"], doc["uid"]["id"]


def _merge(mine: dict[tuple[str, str], dict], doc: dict) -> bool:
    """Add an ask's document to its own set; False when the ask holds two different ones for one id."""
    return mine.setdefault(_uid(doc), doc) == doc


def _grow(shared: SharedEntities, used: dict[tuple[str, str], dict]) -> Any:
    """A parsed store holding the `used` documents (the shared one, grown), or None when Cedar refuses them.

    Adding to a parsed store copies it (about 0.4 us an entity against 15 us to parse one), so
    past SHARED_ENTITIES a call starts the shared store afresh from its own documents. A refused
    parse leaves the shared store as it was, so a bad document fails the calls that carry it
    (each then asks alone) and no later one.
    """
    new = {uid: doc for uid, doc in used.items() if uid not in shared.store}
    if not new:
        return shared.entities
    fresh = shared.entities is None or len(shared.store) + len(new) > SHARED_ENTITIES
    try:
        if fresh:
            entities = cedarpy.Entities.from_json_str(orjson.dumps(list(used.values())).decode())
        else:
            entities = shared.entities.with_added_json_str(orjson.dumps(list(new.values())).decode())
    except Exception:  # noqa: BLE001 - every ask of the call is then asked alone
        return None
    if fresh:
        shared.store = dict(used)
    else:
        shared.store.update(new)
    shared.entities = entities
    return entities
