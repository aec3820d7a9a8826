"""The plan writer over a real DuckDB file: restore after a replay, adopt or announce, selects' compilations."""

from __future__ import annotations

from collections import Counter

from compiler.request import parse_request
from tests.agents.applier_kit import outbox, raw
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


def _variants() -> list[dict]:
    """Selects of one catalog that differ in principal, time, budget and query; one names no known entity."""
    return [ATLAS_REQUEST, dict(ATLAS_REQUEST, principal="omar"), dict(ATLAS_REQUEST, budget={"tokens": 200}),
            dict(ATLAS_REQUEST, decision_time="2026-08-01T00:00:00Z"), dict(ATLAS_REQUEST, entity="Nowhere Ltd"),
            {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"},
            dict(ATLAS_REQUEST, query="What does the covenant waiver say about Atlas?")]


def _outcome(result) -> str:
    return result.plan_id if hasattr(result, "plan_id") else f"{type(result).__name__}:{getattr(result, 'code', '')}"


def test_selects_compiled_together_get_what_each_gets_compiled_alone(setup):  # noqa: F811
    """The writer compiles selects that waited together in one pass (candidates read once, Cedar asked once):
    each must get the plan, or the refusal, it gets compiled on its own."""
    state, applier, _ = setup
    applier.apply([raw(*tick("2026-08-30T10:00:00Z"))])
    requests = [parse_request(doc) for doc in _variants()]
    alone = [_outcome(applier.plans.compile_selects([r], Counter())[0]) for r in requests]
    timings: list[float] = []
    together = [_outcome(r) for r in applier.plans.compile_selects(requests, Counter(), timings.append)]
    assert together == alone and len(timings) == len(requests)
    assert len({o for o in alone if o.startswith("plan-")}) == 6  # six different plans
    assert alone[4] == "ResolveError:unknown_entity"  # refused, not compiled


def test_a_bug_met_compiling_selects_together_reaches_only_its_own_caller(setup, monkeypatch):  # noqa: F811
    """Compiled together, one request's unexpected error would fail them all: they are then compiled each alone."""
    import compiler.pipeline as pipeline

    state, applier, _ = setup
    real = pipeline.compile_resolved
    requests = [parse_request(doc) for doc in _variants()[:3]]

    def compile_resolved(resolved, verdict=None):
        if resolved.request.principal == "omar":
            raise RuntimeError("a bug met by this request only")
        return real(resolved, verdict)

    monkeypatch.setattr("compiler.batch.compile_resolved", compile_resolved)
    monkeypatch.setattr("compiler.pipeline.compile_resolved", compile_resolved)
    out = applier.plans.compile_selects(requests, Counter())
    assert isinstance(out[1], RuntimeError)
    assert [state.plans.fresh_plan(r.plan_key)["plan_id"] for r in (out[0], out[2])] == [out[0].plan_id, out[2].plan_id]
