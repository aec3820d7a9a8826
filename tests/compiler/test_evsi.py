"""The 000 seed's payment case: hard gates first, EVSI net of a visible penalty, stop rules."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import orjson
import pytest

from bench.baselines import plain_top_k
from compiler.evsi import ModelError, decision_model
from compiler.pipeline import compile_request
from tests.catalog_double import SCENARIOS, MemoryCatalog

REQUEST = orjson.loads((SCENARIOS / "payment-request.json").read_bytes())


def seed3(value: float) -> str:
    """Three decimals rounded half up, as the seed prints them (3.9105 -> 3.911)."""
    return str(Decimal(repr(value)).quantize(Decimal("0.001"), ROUND_HALF_UP))


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
    assert (seed3(registry['evsi']), f"{registry['penalty']:.3f}", f"{registry['net']:.3f}") == (
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


def test_a_copy_of_an_observed_source_is_not_worth_observing():
    from compiler.evsi import plan_observations
    from compiler.request import Budget
    from schemas.codec import contract_from
    from schemas.records import Resource

    body = orjson.loads((SCENARIOS / "payment.jsonl").read_text().splitlines()[0])["event"]["decision_types"]
    model = decision_model(contract_from("payment.release", body["payment.release"]))
    original, copy = (Resource(id=i, version=1, entity="E", evidence_class="approval_record", tokens=50,
                               provenance_group="erp") for i in ("registry", "registry-copy"))
    plan = plan_observations([original, copy], model, Budget(), {})
    # Before the copy rule both were read: without an outcome the belief does not move, so the
    # copy looked exactly as valuable as the first reading.
    assert [r.id for r in plan.admitted] == ["registry"]
    assert dict(plan.rejected) == {"registry-copy": "not_worth_it"}
