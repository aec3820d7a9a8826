"""Review of 2d5752e (FEW 64 -> 1024): the row path must write what the column-wise path writes above 64 plans.

(Checked and passing, so not kept here: row == column-wise at 40 and 100 plans for a policy version, a withheld
and a named resource deleted, the three in one batch, and after an earlier batch announced some of the plans.)"""

from __future__ import annotations

import orjson
from agents.plans.plan_writer import PlanWriter
from tests.agents.test_invalidation import raw
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import envelope
from tests.state.test_fan_out import _written


def _bundle():
    return orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]


BATCHES = {
    "policy version": lambda: [("policy-versions", dict(_bundle(), event_id="v2", version=2))],
    "withheld deleted": lambda: [("source-changes", envelope(event_id="del-x9", kind="resource", op="delete",
                                                            resource={"id": "investigation-X9"}))],
    "named deleted": lambda: [("source-changes", envelope(event_id="del-p2", kind="resource", op="delete",
                                                         resource={"id": "policy-P2"}))],
    "several events": lambda: [
        ("source-changes", envelope(event_id="del-p2", kind="resource", op="delete", resource={"id": "policy-P2"})),
        ("source-changes", envelope(event_id="del-x9", kind="resource", op="delete",
                                    resource={"id": "investigation-X9"})),
        ("policy-versions", dict(_bundle(), event_id="v2", version=2))],
}


def _run(tmp_path, monkeypatch, batch: str, row: bool | None, plans: int,
         memo_full: bool = False) -> dict:
    """`row`: True row by row, False column-wise, None as `announce_first.FEW` decides."""
    from state.local_state import LocalState
    from agents.stream.event_apply import EventApplier
    from agents.web.query import QueryService
    from agents.plans import plan_writer as pw

    state = LocalState.open(tmp_path / f"{ {True: 'row', False: 'col', None: 'few'}[row]}-{batch}.duckdb")
    try:
        writer = PlanWriter(state, lambda name: f"x-{name}", eager_limit=0)
        inv = EventApplier(state, writer)
        inv.apply([raw(item["topic"], item["event"], offset=n) for n, item in
                   enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
        query = QueryService(state, writer)
        for i in range(plans):
            query.select(dict(ATLAS_REQUEST, query=f"copy {i}"))
        query.select(dict(ATLAS_REQUEST, principal="omar", purpose="annual_credit_review"))
        with monkeypatch.context() as patch:
            patch.setattr("agents.plans.plan_writer.wall_now", lambda: "2026-11-30T10:00:00Z")
            if row is not None:
                patch.setattr("agents.plans.announce_first.FEW", 10**9 if row else 0)
            patch.setattr("agents.plans.announce_first.COMPILE_FIRST", 0)
            state.outbox.remove([seq for seq, *_ in state.outbox.pending(100_000)])
            if memo_full:
                # A worker that has compiled ~20,000 plans since it started: the memo is about full, and one
                # plan of the batch was compiled elsewhere (adopted) so its entry is missing.
                known = state.store.cached(pw.DISCOVERABLE_MEMO, dict)
                known.pop(next(iter(known)))
                for n in range(pw.DISCOVERABLE_ENTRIES - len(known)):
                    known[f"other-plan-{n}"] = set()
            inv.apply([raw(t, e, offset=1000 + n) for n, (t, e) in enumerate(BATCHES[batch]())], standby=True)
        return _written(state)
    finally:
        state.close()


def test_a_fan_out_of_100_plans_names_a_resource_they_rejected_by_name_when_the_discoverable_memo_overflows(
        tmp_path, monkeypatch):
    # FEW as shipped (1024): 100 plans take the row path, which reads `PlanWriter.discoverable`; its memo is cleared
    # when full *after* it was read, and every plan it knew is then taken for one that may not learn of the resource.
    # With FEW = 64 these 100 plans went column-wise, where the redaction is decided from each plan in SQL.
    shipped, col = (_run(tmp_path, monkeypatch, "named deleted", r, 100, memo_full=True) for r in (None, False))
    named = [orjson.loads(v)["cause"]["dependency_key"] for t, _, v, *_ in col["outbox"] if t == "x-plan-invalidations"]
    assert named.count("resource:policy-P2") == 100  # maya's 100 plans rejected policy-P2 by name (omar's did not)
    public = [orjson.loads(v)["cause"]["dependency_key"] for t, _, v, *_ in shipped["outbox"]
              if t == "x-plan-invalidations"]
    assert public.count("resource:withheld") == 1, f"{public.count('resource:withheld')} of {len(public)} withheld"
    assert shipped == col
