"""Through the broker: a principal's attribute change is announced only once a stored policy reads that attribute."""

from __future__ import annotations

import orjson
import pytest

from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST


def _maya(event_id: str, **attributes: str) -> tuple[str, dict]:
    return "source-changes", {"event_id": event_id, "schema_version": 1, "occurred_at": "2026-08-30T10:00:00Z",
                              "kind": "principal", "op": "upsert",
                              "principal": {"id": "maya", "roles": ["credit_analyst"], "delegation_version": 3,
                                            "attributes": dict(unit="corporate-credit", **attributes)}}


@pytest.mark.timeout(120)
async def test_an_attribute_no_policy_reads_announces_nothing_until_a_bundle_reads_it(worker):
    token = await worker.load("atlas.jsonl")
    first = await worker.select(ATLAS_REQUEST, token)
    token = await worker.publish_events(_maya("phone-1", phone="555-0100"))
    assert (await worker.select(ATLAS_REQUEST, token))["plan_id"] == first["plan_id"]  # read by no policy

    # A bundle version that reads the attribute (spelt with an escape, as Cedar allows): from now on it matters.
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    bundle = dict(bundle, event_id="reads-phone", version=2, cedar=bundle["cedar"] + (
        'forbid(principal, action, resource) when { principal has phone && principal["\\u{70}hone"] == "0" };\n'))
    token = await worker.publish_events(("policy-versions", bundle))
    second = await worker.select(ATLAS_REQUEST, token)
    token = await worker.publish_events(_maya("phone-2", phone="0"))
    third = await worker.select(ATLAS_REQUEST, token)
    assert third["plan_id"] != second["plan_id"] and not third["admitted"]  # the forbid now denies everything

    seen = await worker.records("plan-invalidations", lambda rs: any(
        r["plan_id"] == second["plan_id"] and r["cause"]["event_id"] == "phone-2" for r in rs))
    [told] = [r for r in seen if r["cause"]["event_id"] == "phone-2"]
    assert told["reason"] == "principal_changed"
    assert not [r for r in seen if r["cause"]["event_id"] == "phone-1"]
