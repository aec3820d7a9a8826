"""An announced plan whose successor a select compiled identical counts as an unnecessary announcement."""
from __future__ import annotations

from agents.plans.backlog import recompile_queued
from tests.agents.applier_kit import raw
from tests.conftest import ATLAS_REQUEST
from tests.events import resource


def test_an_identical_successor_compiled_by_a_select_counts_as_an_unnecessary_announcement(setup, monkeypatch):  # noqa: F811
    """Commit ed2fa1d: "Precision stays honest: announced plans whose successor came out identical are counted as
    announced_unchanged". Only the backlog counts them (agents/plans/backlog.py); when a select compiles the
    successor first (`PlanWriter.compile_select`, the usual case for a plan that is asked for), the backlog skips
    the key as fresh and the over-invalidation is counted nowhere: the measured precision overstates."""
    state, inv, query = setup
    monkeypatch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)  # the left-out note: announced first
    plan = query.select(ATLAS_REQUEST)
    same = resource("rm-note-N7", version=2, cls="case_note", valid_to=None, provenance_group="relationship-management",
                    content="The relationship manager says renewal was requested (typo fixed).")
    inv.apply([raw(*same)])
    again = query.select(ATLAS_REQUEST)  # between the announcement and the backlog
    assert again["plan_id"] == plan["plan_id"] and again["served_from"] == "compiled"
    while recompile_queued(inv.plans, 16):
        pass
    counters = state.store.counters()
    assert counters.get("invalidations") == 1
    assert counters.get("announced_unchanged", 0) == 1, counters
