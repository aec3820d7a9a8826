"""Pass 4 reason precedence: a resource Cedar denies is only ever withheld, whatever else is wrong with it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from compiler.admission import admit
from compiler.pipeline import compile_request
from tests.catalog_double import MemoryCatalog
from tests.conftest import ATLAS_REQUEST

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
DENIED_AND_ALSO = {  # each would be rejected for its own reason if Cedar permitted it
    "superseded": {"superseded_by": "investigation-X10"},
    "expired": {"valid_to": datetime(2026, 8, 25, tzinfo=timezone.utc)},
    "not_yet_valid": {"valid_from": datetime(2026, 9, 5, tzinfo=timezone.utc)},
    "stale": {"valid_from": datetime(2025, 6, 1, tzinfo=timezone.utc)},  # waiver_valid has max_age P400D
    "other_entity": {"entity": "BOREAL-UK-02"},
}


@pytest.fixture
def atlas() -> MemoryCatalog:
    return MemoryCatalog.from_scenario("atlas.jsonl")


@pytest.mark.parametrize("flaw", sorted(DENIED_AND_ALSO))
def test_a_denied_resource_is_withheld_never_rejected(atlas, flaw):
    # investigation-X9 is restricted to financial_crime; maya is a credit analyst.
    x9 = atlas.resources["investigation-X9"]
    denied = replace(x9, id=f"x9-{flaw}", evidence_class="approved_waiver", **DENIED_AND_ALSO[flaw])
    contract, policy = atlas.contract("credit.review.continuation")
    admission = admit([denied], entity_id="ATLAS-IN-01", principal=atlas.principal("maya"), contract=contract,
                      policy=policy, purpose="annual_credit_review", decision_time=NOW)
    assert admission.withheld == (denied.id,)
    assert admission.rejected == () and admission.typed == ()


# The catalog offers only the entity's own resources, so another entity's is checked through admit() only.
@pytest.mark.parametrize("flaw", sorted(set(DENIED_AND_ALSO) - {"other_entity"}))
def test_the_plan_lists_no_reason_for_a_denied_resource(atlas, flaw):
    x9 = atlas.resources["investigation-X9"]
    atlas.resources["investigation-X9"] = replace(x9, evidence_class="approved_waiver", **DENIED_AND_ALSO[flaw])
    plan = compile_request(ATLAS_REQUEST, atlas, NOW)
    assert "investigation-X9" not in {r["resource_id"] for r in plan.plan["rejected"]}
    assert plan.plan["withheld"] == 1
    assert {"resource_id": "investigation-X9", "reason": "not_authorised"} in plan.receipt["rejected"]
