"""The invalidator and principal changes: which attribute edits invalidate, and replayed updates."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import resource
from tests.agents.applier_kit import outbox, raw


def _maya(**attributes) -> tuple[str, dict]:
    return "source-changes", {"event_id": f"maya-{sorted(attributes.items())}", "schema_version": 1,
                              "occurred_at": "2026-08-30T10:00:00Z", "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": ["credit_analyst"], "delegation_version": 3,
                                            "attributes": dict(unit="corporate-credit", **attributes)}}


def test_a_principal_attribute_invalidates_only_when_some_policy_reads_it(setup):
    state, inv, query = setup
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    bundle = dict(bundle, event_id="v2", version=2, cedar=bundle["cedar"] + (
        'forbid(principal, action == Action::"use", resource) when { resource.evidence_class == "approved_waiver" '
        '&& principal has clearance && principal.clearance == "low" };\n'))
    inv.apply([raw("policy-versions", bundle), raw(*_maya(clearance="high")), raw(*resource("approved-waiver-W2"))])
    plan = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" in {a["resource_id"] for a in plan["admitted"]}
    before = len(outbox(state, "plan-invalidations"))

    inv.apply([raw(*_maya(clearance="high", phone="555-0100"))])   # read by no policy: nothing to do
    assert len(outbox(state, "plan-invalidations")) == before
    assert query.select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]

    inv.apply([raw(*_maya(clearance="low", phone="555-0100"))])    # read by the forbid rule
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    after = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" not in {a["resource_id"] for a in after["admitted"]}


def test_an_unread_principal_attribute_cedar_cannot_hold_still_invalidates(setup):
    # Cedar's integers are signed 64-bit: the recompiled plan denies everything, so the cached one must go.
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    assert plan["admitted"]
    before = len(outbox(state, "plan-invalidations"))
    inv.apply([raw(*_maya(phone=2**63))])
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert query.select(ATLAS_REQUEST)["admitted"] == []
    inv.apply([raw(*_maya(phone="555-0100"))])  # representable again: the plan comes back
    assert len(outbox(state, "plan-invalidations")) == before + 2
    assert query.select(ATLAS_REQUEST)["admitted"]


def _maya_with(attributes: dict) -> tuple[str, dict]:
    topic, event = _maya()
    event["event_id"] = f"maya-{hashlib.sha256(orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS)).hexdigest()}"
    event["principal"]["attributes"] = dict(event["principal"]["attributes"], **attributes)
    return topic, event


def _forbid_waivers_when(condition: str) -> dict:
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    return dict(bundle, event_id="v2", version=2, cedar=bundle["cedar"] + (
        'forbid(principal, action == Action::"use", resource) when { resource.evidence_class == "approved_waiver" '
        f'&& {condition} }};\n'))


@pytest.mark.parametrize("name, condition", [
    ("level!", 'principal has "level!" && principal["level!"] == "low"'),   # no word boundary after the name
    ("-", 'principal has "-" && principal["-"] == "low"'),                  # no word character at all
    ("clearance", 'principal has "\\u{63}learance" && principal["\\u{63}learance"] == "low"'),  # spelt by an escape
])
def test_a_principal_attribute_a_policy_reads_by_any_spelling_invalidates(setup, name, condition):
    state, inv, query = setup
    inv.apply([raw("policy-versions", _forbid_waivers_when(condition)), raw(*_maya_with({name: "high"})),
               raw(*resource("approved-waiver-W2"))])
    plan = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" in {a["resource_id"] for a in plan["admitted"]}
    before = len(outbox(state, "plan-invalidations"))
    inv.apply([raw(*_maya_with({name: "low"}))])                   # read by the forbid rule
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert "approved-waiver-W2" not in {a["resource_id"] for a in query.select(ATLAS_REQUEST)["admitted"]}


@pytest.mark.parametrize("old, new, literal", [(1, True, "true"), (0, False, "false"),
                                                (1, 1.0, 'decimal("1.0")'), ([1], [True], "[true]")])
def test_a_read_principal_attribute_changing_type_but_not_python_equality_invalidates(setup, old, new, literal):
    # Python holds 1 == True == 1.0; Cedar does not (a Long, a Bool, a decimal): the forbid rule now applies.
    state, inv, query = setup
    inv.apply([raw("policy-versions", _forbid_waivers_when(f"principal has blocked && principal.blocked == {literal}")),
               raw(*_maya_with({"blocked": old})), raw(*resource("approved-waiver-W2"))])
    plan = query.select(ATLAS_REQUEST)
    assert "approved-waiver-W2" in {a["resource_id"] for a in plan["admitted"]}
    before = len(outbox(state, "plan-invalidations"))
    inv.apply([raw(*_maya_with({"blocked": new}))])
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert "approved-waiver-W2" not in {a["resource_id"] for a in query.select(ATLAS_REQUEST)["admitted"]}


def test_an_unread_principal_attribute_too_deep_for_cedar_still_invalidates(setup):
    # Cedar's entity parser stops at 128 levels of nesting: the principal is denied everything on recompile.
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    assert plan["admitted"]
    before = len(outbox(state, "plan-invalidations"))
    deep: object = "555-0100"
    for _ in range(125):  # short of orjson's limit (1024) and the event size bound
        deep = {"n": deep}
    inv.apply([raw(*_maya_with({"phone": deep}))])
    [announced] = outbox(state, "plan-invalidations")[before:]
    assert announced["plan_id"] == plan["plan_id"] and announced["reason"] == "principal_changed"
    assert query.select(ATLAS_REQUEST)["admitted"] == []

def _maya_roles(event_id: str, roles: list[str]) -> tuple[str, dict]:
    return "source-changes", {"event_id": event_id, "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                              "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": roles, "delegation_version": 3,
                                            "attributes": {"unit": "corporate-credit"}}}


def test_a_replayed_principal_update_does_not_undo_a_later_one(setup):
    state, inv, query = setup
    grant = _maya_roles("maya-grant", ["credit_analyst", "financial_crime"])
    inv.apply([raw(*grant)])
    inv.apply([raw(*_maya_roles("maya-narrow", ["credit_analyst"]))])
    inv.apply([raw(*grant)])  # the same event again, at a new offset (a producer retry, a re-published file)
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    assert query.select(ATLAS_REQUEST)["withheld"] == 1  # investigation-X9 stays out of her plan


def test_a_principal_update_repeated_in_one_batch_does_not_undo_a_later_one(setup):
    state, inv, query = setup
    grant = _maya_roles("maya-grant", ["credit_analyst", "financial_crime"])
    inv.apply([raw(*grant), raw(*_maya_roles("maya-narrow", ["credit_analyst"])), raw(*grant)])
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    assert query.select(ATLAS_REQUEST)["withheld"] == 1

def _roles(event_id: str, roles: list[str]) -> tuple[str, dict]:
    return "source-changes", {"event_id": event_id, "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                              "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": roles, "delegation_version": 3}}


def test_a_replayed_principal_update_does_not_undo_a_later_change(setup):
    state, inv, _ = setup
    first, later = _roles("p-1", ["credit_analyst", "auditor"]), _roles("p-2", ["auditor"])
    inv.apply([raw(*first), raw(*later), raw(*first)])          # a repeat within one batch
    assert state.catalog.principal("maya").roles == ("auditor",)
    inv.apply([raw(*first)])                                    # and at a new offset
    assert state.catalog.principal("maya").roles == ("auditor",)
    assert state.store.counters()["duplicate_events"] == 2


def test_an_id_reused_with_other_content_is_dead_lettered(setup):
    state, inv, _ = setup
    inv.apply([raw(*_roles("p-1", ["auditor"])), raw(*_roles("p-1", ["credit_analyst", "admin"]))])
    [letter] = outbox(state, "dead-letters")
    assert letter["error_class"] == "event_id_conflict" and "admin" not in letter["message"]
    assert state.catalog.principal("maya").roles == ("auditor",)
    inv.apply([raw(*_roles("p-1", ["admin"]))])
    assert state.catalog.principal("maya").roles == ("auditor",)
    assert state.store.counters()["dead_letters.event_id_conflict"] == 2
