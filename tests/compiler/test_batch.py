"""A batch compiles exactly as one request at a time, asking Cedar once per policy set."""

from __future__ import annotations

from datetime import datetime, timezone

import cedarpy
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.batch import compile_many
from compiler.cedar_batch import SharedEntities
from compiler.errors import RequestError
from compiler.pipeline import compile_request
from compiler.policy import compile_policy
from schemas.records import PolicyBundle
from tests.catalog_double import SCENARIOS, MemoryCatalog
from tests.events import principal, resource

NOW = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
NAMES = ("atlas", "payment", "screening")
BASE = {n: orjson.loads((SCENARIOS / f"{n}-request.json").read_bytes()) for n in NAMES}


def catalog() -> MemoryCatalog:
    """The three scenarios in one view: three policy bundles, four principals."""
    view = MemoryCatalog()
    for name in NAMES:
        for line in (SCENARIOS / f"{name}.jsonl").read_text().splitlines():
            if line.strip():
                item = orjson.loads(line)
                view.apply(item["topic"], orjson.dumps(item["event"]))
    return view


def _live(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "decision_time"}


def requests() -> list:
    """Each scenario's request and variations reaching every pass's refusals and outcomes."""
    out: list = []
    for doc in BASE.values():
        out += [doc, _live(doc), dict(doc, budget={"tokens": 120}), dict(doc, budget={"tokens": 0}),
                dict(doc, decision_time="2020-01-01T00:00:00Z"), dict(doc, entity="Nobody Ltd"),
                dict(doc, purpose="marketing"), dict(doc, decision_type="nothing.here"),
                dict(doc, query="What is BOREAL's travel class rule?"), dict(doc, principal="mallory")]
        out += [dict(doc, principal=p) for p in ("maya", "omar", "priya", "lena")]
    return out + [{"not": "a request"}, "[]", dict(BASE["atlas"], budget={"tokens": -1})]


REQUESTS = requests()


def outcome(item):
    if isinstance(item, RequestError):
        return type(item), item.code, item.status, item.message
    return item


def one_by_one(docs, view, now):
    out = []
    for doc in docs:
        try:
            out.append(compile_request(doc, view, now))
        except RequestError as exc:
            out.append(exc)
    return out


@pytest.fixture(scope="module")
def view() -> MemoryCatalog:
    return catalog()


@pytest.mark.parametrize("now", [NOW, None])
def test_the_whole_table_compiles_as_one_request_at_a_time(view, now):
    batch = compile_many(REQUESTS, view, now)
    assert [outcome(x) for x in batch] == [outcome(x) for x in one_by_one(REQUESTS, view, now)]
    kinds = {type(x).__name__ for x in batch}
    assert "CompiledPlan" in kinds and len(kinds) >= 5  # plans and refusals of several passes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(range(len(REQUESTS))), max_size=12))
def test_any_batch_compiles_as_one_request_at_a_time(view, picks):
    docs = [REQUESTS[i] for i in picks]
    assert [outcome(x) for x in compile_many(docs, view, NOW)] == [
        outcome(x) for x in one_by_one(docs, view, NOW)]


def test_cedar_is_asked_once_per_policy_set(view, monkeypatch):
    calls = []
    real = cedarpy.is_authorized_batch

    def counting(requests, policies, entities, *args, **kwargs):
        calls.append(len(requests))
        return real(requests, policies, entities, *args, **kwargs)

    monkeypatch.setattr(cedarpy, "is_authorized_batch", counting)
    compile_many(REQUESTS, view, NOW)
    assert len(calls) == 3  # atlas, payment and screening bundles
    calls.clear()
    one_by_one(REQUESTS, view, NOW)
    assert len(calls) > 10


def _add(view: MemoryCatalog, item: tuple[str, dict]) -> None:
    view.apply(item[0], orjson.dumps(item[1]))


@pytest.mark.parametrize("attributes", [
    {"allowed_roles": "credit_analyst", "allowed_purposes": ["annual_credit_review"]},  # Cedar errors on it
    {"allowed_roles": ["credit_analyst"], "allowed_purposes": ["annual_credit_review"], "n": 2**63},  # no Long
])
def test_a_candidate_that_fails_to_evaluate_is_withheld_alone(attributes):
    view = catalog()
    clean = compile_many([BASE["atlas"], BASE["payment"]], view, NOW)
    _add(view, resource("bad-waiver", attributes=attributes))
    _add(view, principal("maya-2"))
    docs = [BASE["atlas"], dict(BASE["atlas"], principal="maya-2"), BASE["payment"]]
    batch = compile_many(docs, view, NOW)
    assert [outcome(x) for x in batch] == [outcome(x) for x in one_by_one(docs, view, NOW)]
    for plan in batch[:2]:
        assert plan.receipt["policy_errors"] == 1 and plan.plan["withheld"] == clean[0].plan["withheld"] + 1
        assert {"resource_id": "bad-waiver", "reason": "not_authorised"} in plan.receipt["rejected"]
        assert plan.plan["admitted"] == clean[0].plan["admitted"]
    assert batch[2].plan == clean[1].plan and batch[2].receipt == clean[1].receipt


def test_a_batch_shares_no_entity_with_a_policy_that_names_one():
    """A condition reading `User::"omar"` errors when omar is not in the store: batched or not."""
    view = catalog()
    contract, policy = view.contracts["credit.review.continuation"]
    text = 'permit(principal, action, resource) when { User::"omar".roles.contains("x") };'
    naming = compile_policy(PolicyBundle("credit", 2, policy.effective_at, text, ()))
    assert not naming.self_contained and policy.self_contained
    view.contracts["credit.review.continuation"] = (contract, naming)
    docs = [BASE["atlas"], dict(BASE["atlas"], principal="omar")]
    assert [outcome(x) for x in compile_many(docs, view, NOW)] == [outcome(x) for x in one_by_one(docs, view, NOW)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(range(len(REQUESTS))), max_size=16), st.integers(1, 5))
def test_a_batch_compiled_in_chunks_sharing_entities_compiles_as_one_request_at_a_time(view, picks, size):
    docs = [REQUESTS[i] for i in picks]
    shared = SharedEntities()
    chunked = [x for start in range(0, len(docs), size) for x in compile_many(docs[start:start + size], view, NOW,
                                                                               shared)]
    assert [outcome(x) for x in chunked] == [outcome(x) for x in one_by_one(docs, view, NOW)]
