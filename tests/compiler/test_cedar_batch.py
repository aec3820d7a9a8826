"""Many asks answered as each alone: shared store, one call per policy set, failures kept to their ask."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import cedarpy

from compiler import cedar_batch
from compiler.cedar_batch import Ask, SharedEntities, authorise_many
from compiler.policy import authorise, compile_policy, self_contained
from schemas.records import PolicyBundle, Principal, Resource

WHEN = datetime(2026, 8, 30, tzinfo=timezone.utc)
LEVEL = "permit(principal, action, resource) when { resource.level > 3 };\n"
MAYA, OMAR = Principal("maya", ("analyst",)), Principal("omar", ("clerk",))


def policy(text: str, version: int = 1):
    return compile_policy(PolicyBundle("b", version, WHEN, text, ()))


def item(rid: str, **attributes) -> Resource:
    return Resource(rid, 1, "E", "approved_waiver", 10, attributes=attributes)


def alone(asks):
    return [authorise(a.policy, a.principal, a.resources, purpose=a.purpose, decision_type=a.decision_type,
                      decision_time=a.decision_time) for a in asks]


def ask(p, who, *resources, purpose="p"):
    return Ask(p, who, resources, purpose, "d", WHEN)


def counted(monkeypatch, fail_first: bool = False) -> list[int]:
    calls: list[int] = []
    real = cedarpy.is_authorized_batch

    def wrapper(requests, *args, **kwargs):
        calls.append(len(requests))
        if fail_first and len(calls) == 1:
            raise RuntimeError("engine failure")
        return real(requests, *args, **kwargs)

    monkeypatch.setattr(cedarpy, "is_authorized_batch", wrapper)
    return calls


def test_one_call_per_policy_set_and_identical_questions_asked_once(monkeypatch):
    p1, p2 = policy(LEVEL), policy("permit(principal, action, resource) when { principal.roles.contains(\"clerk\") };")
    asks = [ask(p1, MAYA, item("a", level=5), item("b", level="high"), item("c", level=1)),
            ask(p1, OMAR, item("a", level=5)), ask(p2, MAYA, item("a", level=5)),
            ask(p2, OMAR, item("a", level=5), item("d")), ask(p1, MAYA, item("a", level=5)), ask(p1, MAYA)]
    expected = alone(asks)
    calls = counted(monkeypatch)
    assert authorise_many(asks) == expected
    assert calls == [4, 3]  # p1: (maya,a) once, b, c, (omar,a); p2: (maya,a), (omar,a), (omar,d)
    assert expected[0].allowed == (True, False, False) and expected[0].errors == (False, True, False)


def test_an_engine_failure_for_the_batch_is_answered_ask_by_ask(monkeypatch):
    p = policy(LEVEL)
    asks = [ask(p, MAYA, item("a", level=5), item("b", level="high")), ask(p, OMAR, item("c", level=9))]
    expected = alone(asks)
    calls = counted(monkeypatch, fail_first=True)
    assert authorise_many(asks) == expected and expected[1].allowed == (True,)
    assert calls == [3, 2, 1]


def test_two_documents_for_one_entity_are_never_merged(monkeypatch):
    p = policy(LEVEL)
    asks = [ask(p, MAYA, item("a", level=5)), ask(p, OMAR, item("a", level=1)),
            ask(p, Principal("maya", ("other",)), item("e", level=7))]
    expected = alone(asks)
    calls = counted(monkeypatch)
    assert authorise_many(asks) == expected
    assert expected[0].allowed == (True,) and expected[1].allowed == (False,) and len(calls) == 3


def test_unrepresentable_principal_or_candidate_denies_only_itself(monkeypatch):
    p = policy("permit(principal, action, resource);")
    asks = [ask(p, Principal("inf", (), {"score": float("inf")}), item("a")),
            ask(p, MAYA, item("huge", n=2**63), item("fine"))]
    assert authorise_many(asks) == alone(asks)
    assert authorise_many(asks)[1].allowed == (False, True) and authorise_many(asks)[0].errors == (True,)


def test_policies_naming_entities_are_asked_alone(monkeypatch):
    naming = policy('permit(principal, action, resource) when { User::"omar".roles.contains("clerk") };')
    asks = [ask(naming, MAYA, item("a")), ask(naming, OMAR, item("b"))]
    expected = alone(asks)
    assert expected[0].errors == (True,) and expected[1].allowed == (True,)  # omar absent from maya's store
    calls = counted(monkeypatch)
    assert authorise_many(asks) == expected and calls == [1, 1]


def test_self_contained_reads_conditions_only():
    assert self_contained('permit(principal == User::"a", action == Action::"use", resource in Resource::"r");')
    assert self_contained('permit(principal, action, resource) when { action == Action::"use" };')
    assert not self_contained('permit(principal, action, resource) when { principal in User::"admins" };')
    assert not self_contained('permit(principal, action, resource) unless { Resource::"x".secret };')
    assert not self_contained('permit(principal == ?principal, action, resource);')
    assert not self_contained("permit(")


def parsed(monkeypatch) -> list[list[str]]:
    """The entity ids of every document Cedar parses from now on, per parse."""
    seen: list[list[str]] = []
    for name in ("from_json_str", "with_added_json_str"):
        real = getattr(cedarpy.Entities, name)

        def wrapper(*args, real=real, **kwargs):
            seen.append([doc["uid"]["id"] for doc in json.loads(args[-1])])
            return real(*args, **kwargs)

        monkeypatch.setattr(cedarpy.Entities, name, staticmethod(wrapper) if name == "from_json_str" else wrapper)
    return seen


def test_calls_sharing_entities_parse_each_document_once_and_answer_as_alone(monkeypatch):
    p = policy(LEVEL)
    first = [ask(p, MAYA, item("a", level=5), item("b", level=1)), ask(p, OMAR, item("a", level=5))]
    second = [ask(p, MAYA, item("a", level=5), item("c", level=9)), ask(p, OMAR, item("b", level=1))]
    seen = parsed(monkeypatch)
    shared = SharedEntities()
    assert authorise_many(first, shared) == alone(first)
    assert authorise_many(second, shared) == alone(second)
    assert seen == [["maya", "a", "b", "omar"], ["c"]]  # the second call parses only what is new


def test_a_document_refused_by_cedar_fails_only_the_calls_carrying_it(monkeypatch):
    p = policy(LEVEL)
    real = cedar_batch.resource_entity

    def refused(resource):  # a document Cedar will not parse (the conversion normally prevents it)
        doc = real(resource)
        return dict(doc, parents="none") if resource.id == "bad" else doc

    monkeypatch.setattr(cedar_batch, "resource_entity", refused)
    shared = SharedEntities()
    first = [ask(p, MAYA, item("a", level=5), item("bad", level=9))]
    assert authorise_many(first, shared) == alone(first)  # asked alone, by `authorise`
    assert shared.store == {} and shared.entities is None
    second = [ask(p, OMAR, item("a", level=5))]
    assert authorise_many(second, shared) == alone(second) and set(shared.store) == {
        ("User", "omar"), ("Resource", "a")}


def test_a_shared_store_past_its_bound_starts_afresh(monkeypatch):
    monkeypatch.setattr(cedar_batch, "SHARED_ENTITIES", 3)
    p = policy(LEVEL)
    shared = SharedEntities()
    calls = [[ask(p, MAYA, item("a", level=5), item("b", level=1))], [ask(p, MAYA, item("c", level=7))],
             [ask(p, OMAR, item("a", level=5), item("d", level=4))]]
    seen = parsed(monkeypatch)
    for asks in calls:
        assert authorise_many(asks, shared) == alone(asks)
    assert seen == [["maya", "a", "b"], ["maya", "c"], ["omar", "a", "d"]]
    assert set(shared.store) == {("User", "omar"), ("Resource", "a"), ("Resource", "d")}
