"""Differential soundness: after every event, no fresh plan differs from a from-scratch recompile.

Failures are reported unshrunk: shrinking these 25-step scripts took over 300 s, past the test
timeout, and the failing step is named in the assertion anyway. To shrink one locally, run with
FRESHPLAN_SHRINK=1 and `--timeout=0`.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import orjson
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from agents.plans.backlog import recompile_queued
from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.plan_writer import PlanWriter
from agents.web.query import QueryService
from compiler.errors import RequestError
from compiler.pipeline import compile_request
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS

ATLAS = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
BUNDLE = next(item["event"] for item in ATLAS if item["topic"] == "policy-versions")
ENTITIES = ["ATLAS-IN-01", "BOREAL-UK-02"]
CLASSES = ["facility_record", "workflow_event", "approved_waiver", "committee_record", "policy_clause", "case_note"]
PROPS = ["facility_limit", "review_open", "waiver_valid", "continuation_rule"]
DAYS = [f"2026-08-{d:02d}T00:00:00Z" for d in range(20, 32)] + [f"2026-09-{d:02d}T00:00:00Z" for d in range(1, 31)]
BASE = {"decision_type": "credit.review.continuation", "purpose": "annual_credit_review"}
REQUESTS = [dict(BASE, principal=p, entity=e, budget=b, **({"decision_time": t} if t else {}))
            for p in ("maya", "omar") for e in ("Atlas", "BOREAL-UK-02")
            for t in (None, "2026-08-30T00:00:00Z") for b in ({"tokens": 760}, {"tokens": 250})]

resource_event = st.fixed_dictionaries({
    "kind": st.just("resource"), "op": st.sampled_from(["upsert", "upsert", "upsert", "delete"]),
    "id": st.sampled_from(["r1", "r2", "r3", "r4", "facility-F102", "policy-P3", "rm-note-N7"]),
    "entity": st.sampled_from(ENTITIES), "cls": st.sampled_from(CLASSES),
    "supports": st.lists(st.sampled_from(PROPS), max_size=2, unique=True),
    "contradicts": st.lists(st.sampled_from(PROPS), max_size=1, unique=True),
    "valid_from": st.sampled_from(DAYS[:15]), "valid_to": st.one_of(st.none(), st.sampled_from(DAYS)),
    "superseded": st.booleans(), "restricted": st.booleans(),
    # credit-committee is the bundle's named source of waivers: trust is explored both ways.
    "group": st.sampled_from(["g1", "g2", "credit-committee"]), "tokens": st.sampled_from([60, 120, 240])})
principal_event = st.fixed_dictionaries({
    "kind": st.just("principal"), "id": st.sampled_from(["maya", "omar"]),
    "roles": st.lists(st.sampled_from(["credit_analyst", "financial_crime"]), max_size=2, unique=True),
    # `unit` is read by no policy; `clearance` only by the clearance rule a policy step may add.
    "unit": st.sampled_from(["credit", "risk"]), "clearance": st.sampled_from(["low", "high"]),
    "bump_delegation": st.booleans()})
revocation_event = st.fixed_dictionaries({
    "kind": st.just("revocation"), "id": st.sampled_from(["maya", "omar"]),
    "role": st.sampled_from(["credit_analyst", "financial_crime"])})
policy_event = st.fixed_dictionaries({
    "kind": st.just("policy"), "min_independent": st.sampled_from([1, 2]),
    "waiver_classes": st.sampled_from([["approved_waiver"], ["approved_waiver", "committee_record"],
                                       ["approved_waiver", "case_note"]]),
    "forbid_restricted": st.booleans(), "clearance_rule": st.booleans()})
clock_event = st.fixed_dictionaries({"kind": st.just("clock"), "now": st.sampled_from(DAYS)})
select_event = st.fixed_dictionaries({"kind": st.just("select"), "request": st.sampled_from(range(len(REQUESTS)))})
# The same bytes again at a new offset (a producer retry, a re-published file): it must change nothing.
replay_event = st.fixed_dictionaries({"kind": st.just("replay"), "back": st.integers(1, 4)})
events = st.lists(st.one_of(resource_event, resource_event, principal_event, revocation_event, policy_event,
                            clock_event, select_event, replay_event), min_size=1, max_size=25)

PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if os.environ.get("FRESHPLAN_SHRINK") == "1":
    PHASES += [Phase.shrink, Phase.explain]


def _resource(rid: str, cls: str, supports: list[str], valid_from: str, valid_to: str | None = None,
              group: str = "g1") -> dict:
    return {"kind": "resource", "op": "upsert", "id": rid, "entity": "ATLAS-IN-01", "cls": cls,
            "supports": supports, "contradicts": [], "valid_from": valid_from, "valid_to": valid_to,
            "superseded": False, "restricted": False, "group": group, "tokens": 60}


def _maya(roles: list[str]) -> dict:
    return {"kind": "principal", "id": "maya", "roles": roles, "unit": "credit", "clearance": "low",
            "bump_delegation": False}


# Cases hand-made mutants of main survived; each is run before anything generated.
CLAIM_IN_UNACCEPTED_CLASS = [_resource("r1", "case_note", ["waiver_valid"], "2026-08-20T00:00:00Z")]
TICK_AT_VALID_FROM = [_resource("r2", "approved_waiver", ["waiver_valid"], "2026-09-01T00:00:00Z",
                                group="credit-committee"),
                      {"kind": "clock", "now": "2026-09-01T00:00:00Z"}]
TICK_AT_VALID_TO = [_resource("r3", "approved_waiver", ["waiver_valid"], "2026-08-20T00:00:00Z",
                              "2026-08-31T00:00:00Z", group="credit-committee"),
                    {"kind": "clock", "now": "2026-08-31T00:00:00Z"}, {"kind": "select", "request": 0},
                    {"kind": "clock", "now": "2026-08-31T00:00:01Z"}]
REPLAYED_PRINCIPAL = [_maya(["credit_analyst", "financial_crime"]), _maya(["credit_analyst"]),
                      {"kind": "replay", "back": 2}]
PINNED = [CLAIM_IN_UNACCEPTED_CLASS, TICK_AT_VALID_TO, TICK_AT_VALID_FROM, REPLAYED_PRINCIPAL]  # clock ascends


class Feeder:
    """Turns generated steps into wire events with increasing versions and offsets."""

    def __init__(self) -> None:
        self.offsets = itertools.count()
        self.versions = itertools.count(2)
        self.ids = itertools.count()
        self.delegations = {"maya": 3, "omar": 1}  # the Atlas scenario's
        self.sent: list[RawMessage] = []

    def message(self, topic: str, body: dict) -> RawMessage:
        event = {"event_id": f"gen-{next(self.ids)}", "schema_version": 1,
                 "occurred_at": "2026-08-30T00:00:00Z", **body}
        self.sent.append(RawMessage(topic, 0, next(self.offsets), None, orjson.dumps(event)))
        return self.sent[-1]

    def translate(self, step: dict) -> RawMessage:
        kind = step["kind"]
        if kind == "replay":
            again = self.sent[-step["back"]]
            self.sent.append(RawMessage(again.topic, 0, next(self.offsets), None, again.value))
            return self.sent[-1]
        if kind == "resource":
            if step["op"] == "delete":
                return self.message("source-changes", {"kind": "resource", "op": "delete",
                                                       "resource": {"id": step["id"]}})
            acl = ({"allowed_roles": ["financial_crime"], "allowed_purposes": ["investigation"]} if step["restricted"]
                   else {"allowed_roles": ["credit_analyst", "financial_crime"],
                         "allowed_purposes": ["annual_credit_review"]})
            return self.message("source-changes", {"kind": "resource", "op": "upsert", "resource": {
                "id": step["id"], "version": next(self.versions), "entity": step["entity"], "content": step["id"],
                "tokens": step["tokens"], "evidence_class": step["cls"], "supports": step["supports"],
                "contradicts": step["contradicts"], "valid_from": step["valid_from"], "valid_to": step["valid_to"],
                "superseded_by": "x" if step["superseded"] else None, "provenance_group": step["group"],
                "sensitivity": "restricted" if step["restricted"] else "internal", "attributes": acl}})
        if kind == "principal":
            if step["bump_delegation"]:
                self.delegations[step["id"]] = next(self.versions)
            return self.message("source-changes", {"kind": "principal", "op": "upsert", "principal": {
                "id": step["id"], "roles": step["roles"], "delegation_version": self.delegations[step["id"]],
                "attributes": {"unit": step["unit"], "clearance": step["clearance"]}}})
        if kind == "revocation":
            return self.message("revocations", {"principal": step["id"], "revoke": "role", "value": step["role"],
                                                "effective_at": "2026-08-30T00:00:00Z"})
        if kind == "policy":
            bundle = orjson.loads(orjson.dumps(BUNDLE))
            for prop in bundle["decision_types"]["credit.review.continuation"]["propositions"]:
                if prop["id"] == "waiver_valid":
                    prop["accepted_classes"] = step["waiver_classes"]
                    prop["min_independent"] = step["min_independent"]
            if not step["forbid_restricted"]:
                bundle["cedar"] = bundle["cedar"].split("// Restricted")[0]
            if step["clearance_rule"]:
                bundle["cedar"] += ('forbid(principal, action == Action::"use", resource) when { '
                                    'resource.evidence_class == "approved_waiver" && principal has clearance && '
                                    'principal.clearance == "low" };\n')
            bundle.update(version=next(self.versions))
            return self.message("policy-versions", {k: v for k, v in bundle.items()
                                                    if k not in ("event_id", "schema_version", "occurred_at")})
        return self.message("clock", {"now": step["now"]})


def stale_plans(state: LocalState) -> list[str]:
    """Fresh plan heads whose from-scratch recompilation differs (each one a stale serve waiting to happen)."""
    now = state.store.now()
    rows = state.store.db.execute("SELECT h.plan_key, h.plan_id, p.request FROM plan_heads h "
                                  "JOIN plans p USING (plan_id) WHERE p.status = 'fresh'").fetchall()
    stale = []
    for plan_key, plan_id, request in rows:
        try:
            again = compile_request(orjson.loads(request), state.catalog, now).plan_id
        except RequestError:
            again = None
        if again != plan_id:
            stale.append(plan_key)
    return stale


def catalog_rows(state: LocalState) -> dict[str, list[tuple]]:
    """Every row of the tables events write to, for comparing state before and after an event."""
    tables = ("resources", "principals", "revoked", "entities", "policy_bundles", "policy_versions", "contracts",
              "contract_versions", "clock")
    return {t: state.store.db.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables}


TOTALS = {"invalidations": 0, "unchanged_recompilations": 0, "checks": 0}


def run_steps(steps, eager_limit: int = 500, drain: bool = False) -> dict[str, int]:
    """Feed the Atlas scenario and the steps; after each step, no fresh plan may be stale."""
    with tempfile.TemporaryDirectory() as tmp:
        state = LocalState.open(Path(tmp) / "f.duckdb")
        try:
            feeder = Feeder()
            inv = EventApplier(state, PlanWriter(state, lambda name: name, eager_limit=eager_limit))
            query = QueryService(state, inv.plans)
            inv.apply([feeder.message(item["topic"], {k: v for k, v in item["event"].items()
                                                      if k not in ("event_id", "schema_version", "occurred_at")})
                       for item in ATLAS])
            for request in REQUESTS:
                query.select(request)
            for step in steps:
                if step["kind"] == "select":
                    try:
                        query.select(REQUESTS[step["request"]])
                    except RequestError:
                        pass
                elif step["kind"] == "replay":
                    before = catalog_rows(state)
                    inv.apply([feeder.translate(step)])
                    assert catalog_rows(state) == before, f"a replayed event changed state: {step}"
                else:
                    inv.apply([feeder.translate(step)])
                assert stale_plans(state) == [], f"stale plan after {step}"
                TOTALS["checks"] += 1
                if drain:  # successors of announced plans, one at a time
                    recompile_queued(inv.plans, 1)
                    assert stale_plans(state) == [], f"stale successor after {step}"
            return state.store.counters()
        finally:
            state.close()


def pinned(test):
    """Run the pinned cases first, whatever is generated."""
    for steps in reversed(PINNED):
        test = example(steps=steps)(test)
    return test


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=PHASES,
          report_multiple_bugs=False)
@given(steps=events)
@pinned
def test_no_fresh_plan_differs_from_its_recompilation(steps):
    counters = run_steps(steps)
    TOTALS["invalidations"] += counters.get("invalidations", 0)
    TOTALS["unchanged_recompilations"] += counters.get("unchanged_recompilations", 0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=PHASES,
          report_multiple_bugs=False)
@given(steps=events)
@pinned
def test_announcing_first_and_recompiling_later_is_as_sound(steps):
    """The large fan-out path: every touched plan announced at once, successors drained one at a time."""
    run_steps(steps, eager_limit=0, drain=True)


def test_report_over_invalidation():
    """Invalidating every plan on every event would be sound and useless: bound the share that changed nothing.

    Over the pinned cases run as one script, each outcome change is announced and recompilations that
    came out identical stay a minority. The figure from the generated runs above is printed alongside.
    """
    counters = run_steps([step for case in PINNED for step in case])
    changed, same = counters.get("invalidations", 0), counters.get("unchanged_recompilations", 0)
    # The 8 Atlas plans change with each of r1, r3 and r2; the 4 live ones at r3's end and at r2's start.
    assert changed >= 32, counters
    assert same / (changed + same) <= 0.5, counters
    triggered = TOTALS["invalidations"] + TOTALS["unchanged_recompilations"]
    share = TOTALS["unchanged_recompilations"] / triggered if triggered else 0.0
    print(f"\nsoundness: {TOTALS['checks']} post-event checks, {TOTALS['invalidations']} invalidations announced, "
          f"{TOTALS['unchanged_recompilations']} recompilations identical ({share:.1%} over-invalidation); "
          f"pinned script: {changed} invalidations, {same} identical")
