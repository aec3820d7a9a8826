"""The plan writer over a real DuckDB file: restore after a replay, adopt or announce, selects' compilations."""

from __future__ import annotations

from collections import Counter

from compiler.request import parse_request
from tests.agents.test_invalidation import outbox, raw, setup  # noqa: F401 - the fixture
from tests.conftest import ATLAS_REQUEST
from tests.events import resource, tick


def test_restore_adopts_unchanged_plans_and_announces_the_changed_as_state_rebuilt(setup):  # noqa: F811
    state, applier, query = setup
    plan = query.select(ATLAS_REQUEST)
    published = next(p for p in outbox(state, "plans") if p["plan_id"] == plan["plan_id"])
    state.store.db.execute("DELETE FROM outbox")
    assert applier.plans.restore([published]) == (1, 0)
    assert outbox(state, "plan-invalidations") == [] and outbox(state, "plans") == []  # nothing republished
    applier.apply([raw(*resource("approved-waiver-W2"))])  # the outcome changes while the plan is "gone"
    state.store.db.execute("DELETE FROM outbox")
    assert applier.plans.restore([published]) == (1, 1)
    [announced] = outbox(state, "plan-invalidations")
    assert announced["reason"] == "state_rebuilt" and announced["plan_id"] == plan["plan_id"]
    assert announced["successor_plan_id"] not in (None, plan["plan_id"])
    assert announced["cause"]["dependency_key"] == "replay" and outbox(state, "plans") == []


def test_a_selects_compilation_is_stored_published_and_counted_by_the_caller(setup):  # noqa: F811
    state, applier, _ = setup
    counts: Counter[str] = Counter()
    timings: list[float] = []
    compiled = applier.plans.compile_select(parse_request(ATLAS_REQUEST), counts,
                                            timings.append)
    assert counts["compilations"] == 1 and len(timings) == 1
    assert state.plans.fresh_plan(compiled.plan_key)["plan_id"] == compiled.plan_id
    [published] = [p for p in outbox(state, "plans") if p["plan_id"] == compiled.plan_id]
    assert published["compiled_as_of"] == {t: {str(p): o for p, o in parts.items()}
                                           for t, parts in state.store.next_offsets().items()}
    assert "compilations" not in state.store.counters()  # the read path's counters stay in memory


def test_an_unchanged_recompilation_later_in_time_rewrites_nothing_but_its_plan_dependencies_record(setup):  # noqa: F811
    state, applier, query = setup
    applier.plans.eager_limit = 500  # opted in: a few plans are recompiled before announcing
    live = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}
    plan = query.select(live)
    db = state.store.db
    before = db.execute("SELECT plan, compiled_at FROM plans WHERE plan_id = ?", [plan["plan_id"]]).fetchone()
    receipts = db.execute("SELECT count(*) FROM receipts").fetchone()[0]
    applier.apply([raw(*tick("2026-08-30T10:00:00Z"))])  # event time moves; no horizon crossed
    db.execute("DELETE FROM outbox")
    same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None, provenance_group="relationship-management",
                    content="The relationship manager says renewal was requested (typo fixed).")
    applier.apply([raw(*same)])
    assert state.store.counters()["unchanged_recompilations"] == 1 and outbox(state, "plan-invalidations") == []
    assert db.execute("SELECT plan, compiled_at FROM plans WHERE plan_id = ?",
                      [plan["plan_id"]]).fetchone() == before
    assert db.execute("SELECT count(*) FROM receipts").fetchone()[0] == receipts
    [record] = outbox(state, "plan-dependencies")  # the stored plan, now as of the edit
    assert record["plan_id"] == plan["plan_id"] and record["receipt_id"] == plan["receipt_id"]
    assert record["decision_time"] == plan["decision_time"] and record["receipt"]["receipt_id"] == plan["receipt_id"]
    assert record["compiled_as_of"]["source-changes"] == {"0": state.store.next_offsets()["source-changes"][0]}
    assert query.select(live)["receipt_id"] == plan["receipt_id"]
