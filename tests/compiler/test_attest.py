"""Pass 6: validity horizons stay representable at the far ends of time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson

from compiler.attest import next_change
from compiler.pipeline import compile_request
from schemas.codec import resource_from
from schemas.records import Contract, Proposition
from tests.catalog_double import MemoryCatalog
from tests.conftest import ATLAS_REQUEST
from tests.events import resource

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
CONTRACT = Contract("d", ("p",), (Proposition("waiver_valid", ("approved_waiver",), max_age=timedelta.max),))


def far(valid_from: str = "2026-08-29T00:00:00Z", valid_to: str | None = "9999-12-31T23:59:59Z"):
    return resource_from(resource("w-far", valid_from=valid_from, valid_to=valid_to)[1]["resource"])


def test_a_valid_to_at_the_end_of_time_never_changes_the_plan():
    assert next_change([far()], CONTRACT, NOW) is None
    soon = far(valid_to="2026-09-30T23:59:59Z")
    assert next_change([far(), soon], CONTRACT, NOW) == datetime(2026, 10, 1, tzinfo=timezone.utc)


def test_a_future_valid_from_is_still_the_horizon_when_max_age_runs_past_the_end():
    later = far(valid_from="2027-01-01T00:00:00Z")
    assert next_change([later], CONTRACT, NOW) == datetime(2027, 1, 1, tzinfo=timezone.utc)


def test_a_live_plan_compiles_over_a_resource_valid_until_the_end_of_time():
    catalog = MemoryCatalog.from_scenario("atlas.jsonl")
    catalog.apply("source-changes", orjson.dumps(resource("approved-waiver-W2", valid_to="9999-12-31T23:59:59Z")[1]))
    plan = compile_request(dict(ATLAS_REQUEST, decision_time="now"), catalog, NOW)
    assert any(a["resource_id"] == "approved-waiver-W2" for a in plan.plan["admitted"])
