"""Every touched plan is announced in its batch's transaction; the backlog compiles the successors afterwards."""

from __future__ import annotations

from agents.plans.backlog import announcements_out, recompile_queued
from tests.agents.test_event_apply import raw as counted_raw, setup as counted  # noqa: F401 - the fixture with a
# statement counter, and the records of its file: each test module numbers offsets with a counter of its own, and an
# event numbered by the other module's could fall below what the fixture applied (and be skipped as applied)
from tests.agents.applier_kit import outbox, raw
from tests.conftest import ATLAS_REQUEST
from tests.events import resource


def _drain(inv) -> int:
    done = 0
    while n := recompile_queued(inv.plans, 16):
        done += n
    return done


def test_a_touched_plan_is_announced_before_its_successor_is_compiled(setup):  # noqa: F811
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    compilations = state.store.counters().get("compilations", 0)
    inv.apply([raw(*resource("approved-waiver-W2"))])
    [announced] = outbox(state, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["successor_plan_id"] is None
    assert state.store.counters().get("compilations", 0) == compilations  # nothing compiled on the apply path
    assert state.queue.size() == 1 and query.plan_status(plan["plan_id"])["status"] == "invalidated"

    assert _drain(inv) == 1 and state.queue.size() == 0
    [successor] = [p for p in outbox(state, "plans") if p["plan_key"] == plan["plan_key"]
                   and p["plan_id"] != plan["plan_id"]]
    assert query.plan_status(plan["plan_id"])["successor_plan_id"] == successor["plan_id"]
    # The record a new owner would take the plan over from names the plan it replaced.
    [record] = [r for r in outbox(state, "plan-dependencies") if r["plan_id"] == successor["plan_id"]]
    assert record["replaces"] == plan["plan_id"]
    served = query.select(ATLAS_REQUEST)
    assert served["served_from"] == "cache" and served["plan_id"] == successor["plan_id"]


def test_no_select_between_the_announcement_and_the_successor_answers_from_the_announced_plan(setup):  # noqa: F811
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    assert query.select(ATLAS_REQUEST)["served_from"] == "cache"  # held in memory before the change
    inv.apply([raw(*resource("approved-waiver-W2"))])
    between = query.select(ATLAS_REQUEST)
    assert between["served_from"] == "compiled" and between["plan_id"] != plan["plan_id"]
    # The select compiled the successor: the announced plan names it, and the backlog has nothing to do.
    assert query.plan_status(plan["plan_id"])["successor_plan_id"] == between["plan_id"]
    state.outbox.remove([seq for seq, *_ in state.outbox.pending(10_000)])
    _drain(inv)
    assert outbox(state, "plans") == [] and query.select(ATLAS_REQUEST)["plan_id"] == between["plan_id"]


def test_a_plan_touched_by_several_batches_is_announced_once_and_compiled_once(setup):  # noqa: F811
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    for version in range(1, 4):
        inv.apply([raw(*resource("approved-waiver-W2", version=version, content=f"Waiver W2, revision {version}."))])
    assert [a["plan_id"] for a in outbox(state, "plan-invalidations")] == [plan["plan_id"]]
    compilations = state.store.counters().get("compilations", 0)
    assert _drain(inv) == 1
    assert state.store.counters()["compilations"] - compilations == 1
    assert "Waiver W2, revision 3." in [a["content"] for a in query.select(ATLAS_REQUEST)["admitted"]]


def test_an_identical_successor_counts_as_an_unnecessary_announcement(setup, monkeypatch):  # noqa: F811
    state, inv, query = setup
    monkeypatch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)  # as in a batch of many such edits
    plan = query.select(ATLAS_REQUEST)
    same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None, provenance_group="relationship-management",
                    content="The relationship manager says renewal was requested (typo fixed).")
    inv.apply([raw(*same)])
    assert [a["plan_id"] for a in outbox(state, "plan-invalidations")] == [plan["plan_id"]]
    _drain(inv)
    counters = state.store.counters()
    assert counters["announced_unchanged"] == 1 and "unchanged_recompilations" not in counters
    # Its row, announced invalidated, reads fresh again (updated in place), and its record names itself replaced.
    assert query.plan_status(plan["plan_id"])["status"] == "fresh"
    assert [r["replaces"] for r in outbox(state, "plan-dependencies") if r["plan_id"] == plan["plan_id"]][-1:] == [
        plan["plan_id"]]
    again = query.select(ATLAS_REQUEST)
    assert again["plan_id"] == plan["plan_id"] and again["served_from"] == "cache"


def test_a_small_fan_out_is_written_row_by_row_in_fewer_statements(counted, monkeypatch):  # noqa: F811
    state, inv, query, db = counted
    query.select(ATLAS_REQUEST)

    def announce(version: int, few: int) -> int:
        monkeypatch.setattr("agents.plans.announce_first.FEW", few)
        start = db.statements
        inv.apply([counted_raw(*resource("approved-waiver-W2", version=version,
                                         content=f"Waiver W2, revision {version}."))])
        statements = db.statements - start
        assert len([r for r in state.outbox.pending(10_000) if r[1] == "x-plan-invalidations"]) == 1
        state.outbox.remove([seq for seq, *_ in state.outbox.pending(10_000)])
        while recompile_queued(inv.plans, 16):
            pass
        return statements

    announce(1, 64)  # fills the writer's memo
    row_by_row, column_wise = announce(2, 64), announce(3, 0)
    assert row_by_row < column_wise, f"{row_by_row} statements row by row, {column_wise} column-wise"


def test_a_left_out_resource_is_compiled_first_and_an_admitted_one_announced_first(setup):  # noqa: F811
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    admitted = {a["resource_id"] for a in plan["admitted"]}
    assert "rm-note-N7" not in admitted  # the note the plan leaves out
    same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None, provenance_group="relationship-management",
                    content="The relationship manager says renewal was requested (typo fixed).")
    inv.apply([raw(*same)])
    # Compiled before announcing: the outcome is the same plan, so nothing is announced and nothing queued.
    assert outbox(state, "plan-invalidations") == [] and state.queue.size() == 0
    assert state.store.counters()["unchanged_recompilations"] == 1
    assert query.select(ATLAS_REQUEST)["plan_id"] == plan["plan_id"]

    edited = plan["admitted"][0]
    compilations = state.store.counters().get("compilations", 0)
    inv.apply([raw(*resource(edited["resource_id"], version=edited["version"] + 1, content="A new revision."))])
    # A new version of what the plan admitted changes its id: announced at once, compiled later.
    [announced] = outbox(state, "plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and announced["successor_plan_id"] is None
    assert state.queue.size() == 1 and state.store.counters().get("compilations", 0) == compilations


def test_the_backlog_waits_for_the_records_due_when_it_looked_not_for_later_ones(setup):  # noqa: F811
    state, inv, query = setup
    plan = query.select(ATLAS_REQUEST)
    state.outbox.remove([seq for seq, *_ in state.outbox.pending(10_000)])
    inv.apply([raw(*resource("approved-waiver-W2"))])
    assert not announcements_out(inv.plans)  # the announcement is due
    state.outbox.add_many([("x-dead-letters", None, b"{}")])  # a record queued since, by another event
    state.outbox.remove([seq for seq, topic, *_ in state.outbox.pending(10_000) if topic != "x-dead-letters"])
    assert announcements_out(inv.plans) and recompile_queued(inv.plans, 16) == 1
    assert query.plan_status(plan["plan_id"])["successor_plan_id"] is not None
