"""Finding 4 of issue 10 through the broker: Cedar fails closed, and numbers compare as authors expect."""

from __future__ import annotations

import orjson

from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import CREDIT, envelope, resource

BUNDLE = {k: v for k, v in orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"].items()
          if k not in ("event_id", "schema_version", "occurred_at")}
WAIVERS = 'forbid(principal, action == Action::"use", resource) when { resource.evidence_class == "approved_waiver" && '


def bundle(version: int, *rules: str) -> tuple[str, dict]:
    return "policy-versions", envelope(**dict(BUNDLE, version=version, cedar=BUNDLE["cedar"] + "\n".join(rules)))


def waiver(rid: str, **attributes) -> tuple[str, dict]:
    return resource(rid, attributes=dict(CREDIT, **attributes))


def admitted(plan: dict) -> set[str]:
    return {a["resource_id"] for a in plan["admitted"]}


async def test_policy_errors_deny_and_decimals_compare(worker):
    fresh = await worker.load("atlas.jsonl")
    base = await worker.select(ATLAS_REQUEST, fresh)
    fresh = await worker.publish_events(
        bundle(2, WAIVERS + "resource.risk_score >= 8 };", WAIVERS + "resource.legal_hold == true };"),
        waiver("waiver-null-hold", risk_score=1, legal_hold=None),       # the forbid errors on the null
        waiver("waiver-risky", risk_score=9.5, legal_hold=False))         # the forbid errors on the decimal
    plan = await worker.select(ATLAS_REQUEST, fresh)
    assert plan["policy"]["version"] == 2
    assert not admitted(plan) & {"waiver-null-hold", "waiver-risky"}
    assert plan["withheld"] == base["withheld"] + 2 and admitted(plan) == admitted(base)
    receipts = await worker.records("receipts", lambda rs: any(r["plan_id"] == plan["plan_id"] for r in rs))
    assert next(r for r in receipts if r["plan_id"] == plan["plan_id"])["policy_errors"] == 2
    assert (await worker.get("/healthz"))["counters"]["policy_errors"] >= 2

    # An operator comparison against a decimal can never evaluate: the bundle is refused whole.
    fresh = await worker.publish_events(bundle(3, WAIVERS + 'resource.risk_score >= decimal("8.0") };'))
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= 1)
    assert [r["error_class"] for r in letters] == ["invalid_policy"] and "greaterThanOrEqual" in letters[0]["message"]
    assert (await worker.select(ATLAS_REQUEST, fresh))["policy"]["version"] == 2

    # Written with the decimal methods, the comparison decides without errors.
    fresh = await worker.publish_events(
        bundle(4, WAIVERS + 'resource.risk_score.greaterThanOrEqual(decimal("8.0")) };',
               WAIVERS + "resource.legal_hold == true };"),
        waiver("waiver-safe", risk_score=2.5, legal_hold=False), waiver("waiver-null-hold", version=2,
                                                                        risk_score=1.0, legal_hold=None))
    plan = await worker.select(ATLAS_REQUEST, fresh)
    assert plan["policy"]["version"] == 4 and "waiver-safe" in admitted(plan)
    assert not admitted(plan) & {"waiver-null-hold", "waiver-risky"}
    receipts = await worker.records("receipts", lambda rs: any(r["plan_id"] == plan["plan_id"] for r in rs))
    assert next(r for r in receipts if r["plan_id"] == plan["plan_id"])["policy_errors"] == 1   # only the null
