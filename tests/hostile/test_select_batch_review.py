"""A hostile review of selects that waited together compiled in one pass (agents/plans/select_compile.py over
state/catalog_snapshot.py and compiler/batch.py): each gets what it gets compiled alone. The writer's part of that
review is tests/hostile/test_writer_fairness_review.py.

In-process over a real DuckDB file, as tests/agents/test_plan_writer.py and tests/agents/test_select_compiles.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import orjson
import pytest

import agents.plans.select_compile as select_compile
from agents.plans.plan_writer import PlanWriter
from agents.plans.select_compile import compile_requests
from agents.stream.event_apply import EventApplier
from compiler.errors import RequestError
from compiler.pipeline import compile_request
from compiler.request import parse_request
from state.catalog_snapshot import CatalogSnapshot
from state.local_state import LocalState
from tests.agents.applier_kit import raw
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import envelope, principal, resource, revoke_role, tick

pytestmark = pytest.mark.timeout(60)

TYPE = "credit.review.continuation"
ASK = ('\npermit(principal, action == Action::"ask", resource)\n'
       'when { principal has tenants && resource has id && principal.tenants.contains(resource.id) };\n')
SCOPED_FROM = "2026-08-30T08:00:00Z"
LIVE = {k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"}


def _scoped_bundle(version: int, effective_at: str) -> tuple[str, dict]:
    """Atlas's bundle at a later version that scopes questions to the principal's tenants (ask_scope)."""
    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    types = orjson.loads(orjson.dumps(first["decision_types"]))
    # Scoped, and without the continuation rule: the two versions' contracts retrieve different candidates.
    types[TYPE].update(ask_scope=True, propositions=[p for p in types[TYPE]["propositions"]
                                                     if p["id"] != "continuation_rule"])
    return "policy-versions", dict(first, event_id=f"credit-v{version}", version=version, effective_at=effective_at,
                                   cedar=first["cedar"] + ASK, decision_types=types)


def _entity(eid: str, *aliases: str) -> tuple[str, dict]:
    return "source-changes", envelope(kind="entity", op="upsert", entity={"id": eid, "aliases": list(aliases)})


def _hostile_world(applier) -> None:
    """Two policy versions in effect at different times (the second scoped), a tenant-scoped principal, a revoked
    one, an entity whose alias is another entity's canonical id in another case, and its own resources."""
    applier.apply([raw(*e) for e in (
        _scoped_bundle(2, SCOPED_FROM),
        principal("tessa", tenants=["ATLAS-IN-01"]),
        principal("rita"),
        revoke_role("rita", "credit_analyst"),
        _entity("ORION-03", "boreal-uk-02", "Orion"),
        resource("orion-waiver-O1", entity="ORION-03"),
        tick("2026-08-30T10:00:00Z"),
    )])


def _docs() -> list[dict]:
    old = dict(ATLAS_REQUEST, decision_time="2026-08-01T00:00:00Z")
    return [
        ATLAS_REQUEST,                                              # v1 in effect (before SCOPED_FROM)
        LIVE,                                                       # v2: maya names no tenant -> out of scope
        dict(LIVE, principal="tessa"),                              # v2, in her scope
        dict(ATLAS_REQUEST, principal="tessa", entity="ATLAS-IN-01", decision_time="2026-08-30T08:30:00Z"),
        dict(LIVE, principal="tessa", entity="boreal-uk-02"),       # alias of ORION-03, not her tenant
        dict(old, query="Compare Atlas with Boreal on the waiver"),  # the query names another tenant
        dict(old, principal="omar"),
        dict(old, principal="nobody"),                              # unknown principal
        dict(LIVE, principal="nobody"),
        dict(old, principal="rita"),                                # revoked role
        dict(LIVE, principal="rita"),
        dict(old, entity="BOREAL-UK-02"),                           # id of one, alias (any case) of another: 409
        dict(old, entity="Nowhere Ltd"),                            # 404
        dict(ATLAS_REQUEST, decision_time="2025-06-01T00:00:00Z"),  # before any version: policy_not_effective
        dict(old, budget={"tokens": 0}),                            # empty_budget
        dict(old, decision_type="no.such.type"),                    # unknown_decision_type
        dict(old, purpose="marketing"),                             # purpose_not_allowed
        ATLAS_REQUEST,                                              # the same plan key twice in one job
        dict(LIVE, principal="tessa", entity="atlas india"),        # alias in another case
        dict(old, entity="Orion"),
        dict(ATLAS_REQUEST, decision_time=SCOPED_FROM),             # exactly when v2 takes effect
        dict(ATLAS_REQUEST, decision_time="2026-08-30T07:59:59.999999Z"),  # a microsecond before
        dict(old, entity="ORION-03"),
        dict(old, entity="ATLAS-IN-01"),
    ]


def _outcome(result) -> tuple:
    if isinstance(result, RequestError):
        return (type(result).__name__, result.code, result.status)
    if isinstance(result, BaseException):
        return ("bug", type(result).__name__)
    return (result.plan_id, result.receipt_id, result.plan["stop_reason"])


def _alone(state, requests, now) -> list[tuple]:
    out = []
    for r in requests:
        try:
            out.append(_outcome(compile_request(r, state.catalog, now)))
        except RequestError as exc:
            out.append(_outcome(exc))
    return out


def _no_fallback(monkeypatch) -> list:
    """Record every request compiled alone by `compile_requests`: none may be, or `together == alone` proves
    nothing (the fallback is the old path)."""
    alone: list = []
    real = select_compile.compile_request

    def counted(request, catalog, now):
        alone.append(request)
        return real(request, catalog, now)

    monkeypatch.setattr(select_compile, "compile_request", counted)
    return alone


# -- invariants that held --------------------------------------------------------------------------------------


def test_a_hostile_mix_compiled_together_gets_exactly_what_each_gets_alone(setup, monkeypatch):  # noqa: F811
    """Past and live times across two bundle versions, aliases (in any case, and one that is another entity's id),
    unknown and revoked principals, ask_scope and a query naming another tenant, every refusal of passes 1-5, and
    one plan key twice: plan id, receipt id and refusal (code and HTTP status) are the same both ways, and the
    batch pass really ran (nothing fell back)."""
    state, applier, _ = setup
    _hostile_world(applier)
    requests = [parse_request(d) for d in _docs()]
    now = state.store.now()
    fell_back = _no_fallback(monkeypatch)
    together = [_outcome(r) for r in compile_requests(applier.plans, requests, now)]  # first: no memo warmed alone
    assert fell_back == []
    alone = _alone(state, requests, now)
    assert together == alone
    # The mix really covers what it claims to.
    stops = [o[2] for o in alone if o[0].startswith("plan-")]
    codes = {o[1] for o in alone if not o[0].startswith("plan-")}
    assert stops.count("out_of_scope") >= 3
    assert codes == {"ambiguous_entity", "unknown_entity", "policy_not_effective", "empty_budget",
                     "unknown_decision_type", "purpose_not_allowed"}
    assert alone[0] == alone[17] and alone[0] != alone[20] and alone[20] != alone[21]
    assert alone[7][0] != alone[0][0] and alone[9][0] != alone[0][0]  # unknown / revoked: not maya's plan


def test_compiled_together_by_the_plan_writer_and_stored_answers_as_alone(setup, monkeypatch):  # noqa: F811
    """Through `PlanWriter.compile_selects` (stored once per plan key): each select's plan id is its alone one,
    and the stored head of each key is one of the plans answered for it."""
    state, applier, _ = setup
    _hostile_world(applier)
    requests = [parse_request(d) for d in _docs()]
    alone = _alone(state, requests, state.store.now())
    fell_back = _no_fallback(monkeypatch)
    timings: list[float] = []
    out = applier.plans.compile_selects(requests, Counter(), timings.append)
    assert fell_back == [] and len(timings) == len(requests)
    assert [_outcome(r) for r in out] == alone
    for r in out:
        if not isinstance(r, Exception):
            assert state.plans.fresh_plan(r.plan_key)["plan_id"] == r.plan_id


@pytest.fixture
def no_clock(tmp_path):
    """The atlas world without a clock tick: a live decision has no time (ClockUnknown, 503)."""
    state = LocalState.open(tmp_path / "f.duckdb")
    applier = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
    lines = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
    applier.apply([raw(item["topic"], item["event"]) for item in lines if item["topic"] != "clock"])
    yield state, applier
    state.close()


def test_the_clock_unknown_refuses_live_selects_compiled_together_as_alone(no_clock, monkeypatch):
    state, applier = no_clock
    assert state.store.now() is None
    docs = [ATLAS_REQUEST, LIVE, dict(LIVE, principal="omar"), dict(LIVE, entity="Nowhere Ltd"),
            dict(LIVE, purpose="marketing"), dict(ATLAS_REQUEST, principal="nobody")]
    requests = [parse_request(d) for d in docs]
    fell_back = _no_fallback(monkeypatch)
    together = [_outcome(r) for r in compile_requests(applier.plans, requests, None)]
    assert fell_back == []
    assert together == _alone(state, requests, None)
    assert together[1] == together[2] == ("ClockUnknown", "clock_unknown", 503)


@pytest.mark.timeout(30)
async def test_selects_gathered_on_the_writer_answer_as_each_does_alone(setup):  # noqa: F811
    """End to end through QueryService.select_async and SelectCompiles: one job, each caller its own plan or its
    own refusal (code and status)."""
    state, applier, query = setup
    _hostile_world(applier)
    docs = _docs()
    expected = _alone(state, [parse_request(d) for d in docs], state.store.now())
    busy = asyncio.Event()

    async def run(fn, *args):
        await busy.wait()  # an input batch holds the writer while the selects gather
        return fn(*args)

    tasks = [asyncio.ensure_future(query.select_async(d, run)) for d in docs]
    while query.compiles.waiting + sum(t.done() for t in tasks) < len(docs):  # each joined the job or was refused
        await asyncio.sleep(0.002)
    busy.set()
    got = await asyncio.gather(*tasks, return_exceptions=True)
    for doc, answer, want in zip(docs, got, expected, strict=True):
        if want[0].startswith("plan-"):
            assert isinstance(answer, dict) and answer["plan_id"] == want[0], (doc, answer)
        else:
            assert isinstance(answer, RequestError) and (type(answer).__name__, answer.code, answer.status) == want
    assert query.compiles.jobs <= 2  # gathered (a refusal in parse/resolve never joins)


def test_snapshot_memo_keeps_versions_and_aliases_apart(setup):  # noqa: F811
    """Candidates are memoised by (entity id, id(contract)): two versions' contracts of one type are distinct,
    long-lived objects (Catalog._contracts), and names that are aliases, or a canonical id in another case, memoise
    under the name only, so a resolved id never reads another entity's candidates."""
    state, applier, _ = setup
    _hostile_world(applier)
    docs = [{"principal": "maya", "entity": n, "decision_type": TYPE, "decision_time": t}
            for n in ("Atlas", "ATLAS-IN-01", "boreal-uk-02", "ORION-03", "BOREAL-UK-02")
            for t in ("2026-08-01T00:00:00Z", "2026-08-30T09:00:00Z")]
    view = CatalogSnapshot(state.catalog)
    view.prefetch(docs)
    v1, _ = view.contract(TYPE, parse_request(dict(ATLAS_REQUEST, decision_time="2026-08-01T00:00:00Z")).decision_time)
    v2, _ = view.contract(TYPE, state.store.now())
    assert v1 is not v2
    assert [r.id for r in state.catalog.candidates("ATLAS-IN-01", v1)] != \
           [r.id for r in state.catalog.candidates("ATLAS-IN-01", v2)]
    for eid in ("ATLAS-IN-01", "ORION-03", "BOREAL-UK-02"):
        for contract in (v1, v2):
            assert [r.id for r in view.candidates(eid, contract)] == \
                   [r.id for r in state.catalog.candidates(eid, contract)]
    for name in ("Atlas", "boreal-uk-02", "BOREAL-UK-02", "ORION-03"):
        assert view.entity_matches(name) == state.catalog.entity_matches(name)


def test_a_request_error_mid_batch_stays_with_its_request(setup, monkeypatch):  # noqa: F811
    """A RequestError raised late (pass 4-6, after Cedar was asked for the batch) is that request's only; the
    batch is not abandoned for the alone path."""
    import compiler.batch as batch
    from compiler.errors import PlanError

    state, applier, _ = setup
    real = batch.compile_resolved

    def compile_resolved(resolved, verdict=None):
        if resolved.request.query == "late":
            raise PlanError("late_refusal", "refused after Cedar", status=422)
        return real(resolved, verdict)

    monkeypatch.setattr(batch, "compile_resolved", compile_resolved)
    fell_back = _no_fallback(monkeypatch)
    requests = [parse_request(dict(ATLAS_REQUEST, query=q)) for q in ("a", "late", "b")]
    out = compile_requests(applier.plans, requests, state.store.now())
    assert fell_back == []
    assert isinstance(out[1], RequestError) and out[1].code == "late_refusal"
    assert [o.plan_id for o in (out[0], out[2])] == [compile_request(r, state.catalog, state.store.now()).plan_id
                                                   for r in (requests[0], requests[2])]
