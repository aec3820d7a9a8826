"""Review of 2d5752e: `LOGGED_ONE_BY_ONE` says up to 16 plans *announced* row by row are logged a line each."""

from __future__ import annotations

import logging

from tests.agents.applier_kit import raw
from tests.conftest import ATLAS_REQUEST
from tests.events import resource


def test_two_plans_announced_in_a_batch_touching_twenty_are_logged_a_line_each(setup, caplog,  # noqa: F811
                                                                              monkeypatch):
    state, inv, query = setup
    monkeypatch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)  # announced first, as in a busy batch
    for i in range(18):
        query.select(dict(ATLAS_REQUEST, query=f"copy {i}"))
    inv.apply([raw(*resource("approved-waiver-W2"))])  # the 18 announced, their successors still queued
    fresh = [query.select(dict(ATLAS_REQUEST, query=f"copy {i}")) for i in (18, 19)]
    state.outbox.remove([seq for seq, *_ in state.outbox.pending(10_000)])
    with caplog.at_level(logging.INFO, logger="agents.plans"):
        inv.apply([raw(*resource("approved-waiver-W2", version=2, content="Waiver W2, revision 2."))])
    announced = [r for r in caplog.records if r.getMessage().startswith("invalidated plan ")]
    told = [t for _, t, _, _ in state.outbox.pending(10_000) if t == "x-plan-invalidations"]
    assert len(told) == 2  # 20 touched, 18 announced already: 2 announced
    assert sorted(r.plan_id for r in announced) == sorted(p["plan_id"] for p in fresh), \
        "2 plans announced (<= LOGGED_ONE_BY_ONE) but no per-plan line: the 18 touched earlier made the batch quiet"
