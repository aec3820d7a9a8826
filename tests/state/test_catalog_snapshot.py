"""The memoising snapshot answers exactly as the catalog does, prefetched or not."""

from __future__ import annotations

import orjson

from agents.stream.event_apply import EventApplier
from agents.plans.plan_writer import PlanWriter
from state.catalog_snapshot import CatalogSnapshot
from state.local_state import LocalState
from tests.agents.applier_kit import raw
from tests.catalog_double import SCENARIOS


def test_prefetched_answers_equal_the_catalog(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    inv = EventApplier(state, PlanWriter(state, lambda name: name))
    inv.apply([raw(i["topic"], i["event"]) for i in
               map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines())])
    catalog = state.catalog
    snap = CatalogSnapshot(catalog)
    names = ["ATLAS-IN-01", "atlas india", "Atlas", "nobody"]
    snap.prefetch([{"decision_type": "credit.review.continuation", "entity": n} for n in names])
    for name in names:
        assert snap.entity_matches(name) == list(catalog.entity_matches(name))
    contract, _ = snap.contract("credit.review.continuation")
    assert snap.contract("credit.review.continuation")[0] is contract
    assert snap.candidates("ATLAS-IN-01", contract) == list(catalog.candidates("ATLAS-IN-01", contract))
    assert len(snap.candidates("ATLAS-IN-01", contract)) > 3
    assert snap.principal("maya") == catalog.principal("maya")
    state.close()
