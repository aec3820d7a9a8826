"""A large fan-out, built column-wise: the plan-by-plan path's rows, in a few statements."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from agents.plans.plan_facts import DISCOVERABLE_ENTRIES, DISCOVERABLE_MEMO
from agents.plans.plan_writer import PlanWriter
from tests.agents.applier_kit import raw
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import envelope

PLANS = 12


def _atlas_plans(query, copies: int = PLANS) -> list[dict]:
    """Plans of maya (investigation-X9 withheld, policy-P2 rejected by name) and of omar."""
    plans = [query.select(dict(ATLAS_REQUEST, query=f"copy {i}")) for i in range(copies)]
    return plans + [query.select(dict(ATLAS_REQUEST, principal="omar", purpose="annual_credit_review"))]


def _written(state) -> dict:
    """Everything a fan-out writes, comparable across runs (outbox seq and history seq left out)."""
    db = state.store.db
    return {"outbox": sorted(db.execute("SELECT topic, key, value, src_topic, src_partition, src_offset, standby "
                                        "FROM outbox").fetchall()),
            "history": sorted(db.execute("SELECT plan_id, reason, cause, successor_plan_id, invalidated_at "
                                         "FROM plan_history").fetchall(), key=repr),
            "plans": sorted(db.execute("SELECT plan_id, status, reason, cause, successor_plan_id, invalidated_at "
                                       "FROM plans").fetchall(), key=repr),
            "queue": sorted(db.execute("SELECT plan_key, src_topic, src_partition, src_offset "
                                       "FROM recompile_queue").fetchall()),
            "counters": {k: v for k, v in state.store.counters().items()
                         if k in ("invalidations", "deferred_recompilations")}}


EVENTS = {
    "policy version": lambda bundle: ("policy-versions", dict(bundle, event_id="v2", version=2)),
    "withheld resource deleted": lambda _: ("source-changes", envelope(
        event_id="del-x9", kind="resource", op="delete", resource={"id": "investigation-X9"})),
    "named resource deleted": lambda _: ("source-changes", envelope(
        event_id="del-p2", kind="resource", op="delete", resource={"id": "policy-P2"})),
}


def _fan_out(tmp_path, monkeypatch, event: str, reference: bool | None, limit: int | None = None,
             copies: int = PLANS, prepare=lambda state: None) -> dict:
    """What a fan-out of `event` writes: row by row (`reference`), column-wise (False), or as `FEW` decides (None);
    `prepare(state)` runs just before the event is applied."""
    from state.local_state import LocalState
    from state.outbox import OutboundLimit
    from agents.stream.event_apply import EventApplier
    from agents.web.query import QueryService

    state = LocalState.open(tmp_path / f"{ {True: 'ref', False: 'new', None: 'few'}[reference]}.duckdb")
    try:
        writer = PlanWriter(state, lambda name: f"x-{name}", eager_limit=0)
        inv = EventApplier(state, writer)
        inv.apply([raw(item["topic"], item["event"], offset=n) for n, item in
                   enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
        _atlas_plans(QueryService(state, writer), copies)
        state.outbox.remove([seq for seq, *_ in state.outbox.pending(10_000)])
        state.outbox.limit = limit and OutboundLimit(limit, "x-dead-letters", frozenset())
        with monkeypatch.context() as patch:
            patch.setattr("agents.plans.plan_writer.wall_now", lambda: "2026-11-30T10:00:00Z")
            # The reference: one Invalidation per plan (`announce_first._row_by_row`); else column-wise.
            if reference is not None:
                patch.setattr("agents.plans.announce_first.FEW", 10**9 if reference else 0)
            # Both announce first: a few plans touched through a resource they left out are compiled first otherwise.
            patch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)
            prepare(state)
            bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
            inv.apply([raw(*EVENTS[event](bundle), offset=1000)], standby=True)
        return _written(state)
    finally:
        state.close()


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_a_column_wise_fan_out_writes_what_the_plan_by_plan_path_wrote(tmp_path, monkeypatch, event):
    new, reference = (_fan_out(tmp_path, monkeypatch, event, reference) for reference in (False, True))
    assert new["counters"]["invalidations"] >= PLANS and new["queue"]
    assert new == reference


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_both_paths_write_the_same_above_the_size_the_row_path_once_stopped_at(tmp_path, monkeypatch, event):
    # Row by row went up to 64 plans until 2d5752e, up to 1,024 since: both must agree past 64 too.
    new, reference = (_fan_out(tmp_path, monkeypatch, event, reference, copies=100) for reference in (False, True))
    assert new["counters"]["invalidations"] >= 100
    assert new == reference


def _memo_about_full(state) -> None:
    # A worker that has compiled about 20,000 plans since it started, and one plan of the batch adopted (compiled
    # elsewhere): its entry is missing, so the batch's read overflows the memo.
    known = state.store.cached(DISCOVERABLE_MEMO, dict)
    known.pop(next(iter(known)))
    for n in range(DISCOVERABLE_ENTRIES - len(known)):
        known[f"other-plan-{n}"] = set()


def test_a_full_memo_of_what_principals_may_learn_withholds_nothing_they_may_see(tmp_path, monkeypatch):
    # The row path read the memo, which a batch overflowing it cleared: its plans known before were then taken
    # for plans whose principal may not learn of the resource (found in review, stop 56).
    shipped, column_wise = (_fan_out(tmp_path, monkeypatch, "named resource deleted", reference, copies=100,
                                     prepare=_memo_about_full) for reference in (None, False))
    public = [orjson.loads(v)["cause"]["dependency_key"] for t, _, v, *_ in shipped["outbox"]
              if t == "x-plan-invalidations"]
    assert public.count("resource:policy-P2") == 100 and public.count("resource:withheld") == 1  # omar's
    assert shipped == column_wise


def test_records_over_the_outbound_limit_are_fitted_as_the_plan_by_plan_path_fitted_them(tmp_path, monkeypatch):
    new, reference = (_fan_out(tmp_path, monkeypatch, "withheld resource deleted", reference, limit=880)
                      for reference in (False, True))
    # Receipts (375 B + framing) do not fit.
    assert {t for t, *_ in new["outbox"]} == {"x-plan-invalidations", "x-dead-letters"}
    assert new == reference


def test_the_withheld_resource_is_named_to_auditors_only(tmp_path, monkeypatch):
    written = _fan_out(tmp_path, monkeypatch, "withheld resource deleted", reference=False)
    public = [orjson.loads(v) for t, _, v, *_ in written["outbox"] if t == "x-plan-invalidations"]
    audits = [orjson.loads(v) for t, _, v, *_ in written["outbox"] if t == "x-receipts"]
    assert len(public) == len(audits) == PLANS + 1 and all(r["cause"]["event_id"] == "withheld" for r in public)
    assert {a["plan_id"] for a in audits} == {r["plan_id"] for r in public}
    assert all(a["cause"]["dependency_key"] == "resource:investigation-X9" for a in audits)
    assert len({a["receipt_id"] for a in audits}) == len(audits)


def test_a_fan_out_builds_one_announcement_per_group_not_per_plan(setup, monkeypatch):  # noqa: F811
    state, inv, query = setup
    plans = _atlas_plans(query)
    monkeypatch.setattr("agents.plans.announce_first.FEW", 0)  # column-wise at any size
    built = Counter()
    caused = PlanWriter.caused

    def counted(self, *args, **kwargs):
        built["caused"] += 1
        return caused(self, *args, **kwargs)

    monkeypatch.setattr(PlanWriter, "caused", counted)
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    inv.apply([raw("policy-versions", dict(bundle, event_id="v2", version=2))])
    announced = [orjson.loads(v) for _, t, _, v in state.outbox.pending(10_000) if t == "x-plan-invalidations"]
    assert sorted(r["plan_id"] for r in announced) == sorted({p["plan_id"] for p in plans})
    assert 1 <= built["caused"] <= 2 < len(announced)  # the policy key and the contract key, at most


@pytest.mark.parametrize("point_updates", [0, 10_000])  # set-wise joins, then one pair at a time
def test_successors_compiled_later_are_recorded_on_each_plan_and_its_latest_history_entry(setup, monkeypatch,  # noqa: F811
                                                                                          point_updates):
    from agents.plans.backlog import recompile_queued

    monkeypatch.setattr("state.plan_store.FEW_SUCCESSORS", point_updates)
    state, inv, query = setup
    plans = _atlas_plans(query)
    inv.plans.eager_limit = 0
    bundle = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    inv.apply([raw("policy-versions", dict(bundle, event_id="v2", version=2))])
    assert recompile_queued(inv.plans, 100) == len(plans)
    for plan in plans:
        status = query.plan_status(plan["plan_id"])
        assert status["successor_plan_id"] not in (None, plan["plan_id"])
        assert status["history"][-1]["successor_plan_id"] == status["successor_plan_id"]


def test_a_fan_out_drops_the_held_heads_of_the_plans_it_announces_and_keeps_the_others(setup, monkeypatch):  # noqa: F811
    """Cached selects of plans a fan-out did not touch are still answered from memory after it."""
    state, inv, query = setup
    plans = _atlas_plans(query) + [query.select(dict(ATLAS_REQUEST, entity="Boreal", query="the Boreal waiver"))]
    heads = state.store.heads
    assert all(heads.head(p["plan_key"]) is not None for p in plans)
    monkeypatch.setattr("agents.plans.announce_first.FEW", 0)  # column-wise at any size
    monkeypatch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)
    inv.plans.eager_limit = 0
    inv.apply([raw("source-changes", envelope(event_id="del-p2", kind="resource", op="delete",
                                              resource={"id": "policy-P2"}))])
    announced = {orjson.loads(v)["plan_id"] for _, t, _, v in state.outbox.pending(10_000)
                 if t == "x-plan-invalidations"}
    kept = [p for p in plans if p["plan_id"] not in announced]
    assert announced and kept, "the event must touch some plans and leave others"
    assert all(heads.head(p["plan_key"]) is None for p in plans if p["plan_id"] in announced)
    assert all(heads.head(p["plan_key"]) is not None for p in kept), "untouched plans were dropped from memory"
