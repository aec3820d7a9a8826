"""The 000 seed's payment case: hard gates first, EVSI net of a visible penalty, stop rules."""

from __future__ import annotations

import orjson
import pytest

from bench.baselines import plain_top_k
from compiler.evsi import ModelError, decision_model
from compiler.pipeline import compile_request
from tests.catalog_double import SCENARIOS, MemoryCatalog

REQUEST = orjson.loads((SCENARIOS / "payment-request.json").read_bytes())


@pytest.fixture
def payments() -> MemoryCatalog:
    return MemoryCatalog.from_scenario("payment.jsonl")


def reasons(plan) -> dict[str, str]:
    return {r["resource_id"]: r["reason"] for r in plan["rejected"]}


def test_payment_case_matches_the_seed(payments):
    plan = compile_request(REQUEST, payments, None).plan
    decision = plan["decision"]
    assert decision["initial"]["action"] == "hold" and f"{decision['initial']['expected_loss']:.3f}" == "4.850"
    first = {row["resource_id"]: row for row in decision["rounds"][0]}
    registry, manager = first["approval-registry-481"], first["manager-message-481"]
    assert (f"{registry['evsi']:.3f}", f"{registry['penalty']:.3f}", f"{registry['net']:.3f}") == (
        "3.911", "0.253", "3.658")
    assert (f"{manager['evsi']:.3f}", f"{manager['net']:.3f}") == ("0.000", "-0.167")
    # Hard gates run before scoring: the stale PDF and the forbidden sweep are never scored.
    assert set(first) == {"approval-registry-481", "manager-message-481"}
    assert reasons(plan)["approval-pdf-481"] == "stale"
    assert "mailbox-sweep-481" not in orjson.dumps(plan).decode() and plan["withheld"] == 1
    assert decision["observed"] == [{"resource_id": "approval-registry-481", "outcome": "pending"}]
    assert decision["final"]["action"] == "hold" and f"{decision['final']['expected_loss']:.3f}" == "1.085"
    assert plan["stop_reason"] == "no_positive_value"
    assert [a["resource_id"] for a in plan["admitted"]] == ["approval-registry-481"]


def test_receipt_keeps_forbidden_apart_from_not_worth_it(payments):
    receipt = compile_request(REQUEST, payments, None).receipt
    why = {r["resource_id"]: r["reason"] for r in receipt["rejected"]}
    assert why["mailbox-sweep-481"] == "not_authorised"
    assert why["manager-message-481"] == "not_worth_it"


def test_negative_control_static_top_one_and_adaptive_agree(payments):
    request = dict(REQUEST, entity="PAYCHG-482", budget={"calls": 1, "tokens": 200, "latency_ms": 250,
                                                         "privacy": 0.2})
    plan = compile_request(request, payments, None).plan
    candidates = [r for r in payments.resources.values() if r.entity == "PAYCHG-482"]
    static = plain_top_k(candidates, {r.id: 1.0 for r in candidates}, 1)
    assert [a["resource_id"] for a in plan["admitted"]] == [r.id for r in static] == ["approval-registry-482"]
    assert plan["decision"]["final"]["action"] == "release"


def test_budget_is_a_hard_limit_checked_before_scoring(payments):
    request = dict(REQUEST, budget={"calls": 2, "tokens": 100, "latency_ms": 500, "privacy": 0.5})
    plan = compile_request(request, payments, None).plan
    assert plan["admitted"] == [] and plan["stop_reason"] == "budget_exhausted"
    assert reasons(plan)["approval-registry-481"] == "budget_exceeded"
    assert [row["resource_id"] for row in plan["decision"]["rounds"][0]] == ["manager-message-481"]


def test_malformed_decision_models_are_refused(payments):
    contract, _ = payments.contract("payment.release")
    broken = type(contract)(contract.decision_type, contract.purposes, contract.propositions,
                            loss={"prior": {"approved": 1}, "actions": {"hold": {"pending": 1}}})
    with pytest.raises(ModelError):
        decision_model(broken)
