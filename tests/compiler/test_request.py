"""Pass 1: malformed requests are refused with a code and a sentence, never guessed at."""

from __future__ import annotations

import orjson
import pytest

from compiler.errors import ParseError
from compiler.request import Limits, decode_body, parse_request, plan_key
from tests.conftest import ATLAS_REQUEST


@pytest.mark.parametrize("body, code", [
    ([], "invalid_request"),
    (dict(ATLAS_REQUEST, role="credit_analyst"), "unknown_field"),
    ({k: v for k, v in ATLAS_REQUEST.items() if k != "principal"}, "missing_field"),
    (dict(ATLAS_REQUEST, purpose="  "), "missing_field"),
    (dict(ATLAS_REQUEST, decision_time="yesterday"), "invalid_field"),
    (dict(ATLAS_REQUEST, budget={"tokens": -1}), "invalid_field"),
    (dict(ATLAS_REQUEST, budget={"tokens": 1.5}), "invalid_field"),
    (dict(ATLAS_REQUEST, budget={"gpus": 1}), "unknown_field"),
    (dict(ATLAS_REQUEST, query=7), "invalid_field"),
    (dict(ATLAS_REQUEST, decision_time="0001-01-01T00:00:00+14:00"), "invalid_field"),
    (dict(ATLAS_REQUEST, decision_time="9999-12-31T23:59:59-01:00"), "invalid_field"),
    (dict(ATLAS_REQUEST, budget={"money": float("nan")}), "invalid_field"),
    (dict(ATLAS_REQUEST, budget={"privacy": float("inf")}), "invalid_field"),
    (dict(ATLAS_REQUEST, budget={"tokens": float("inf")}), "invalid_field"),
    (dict(ATLAS_REQUEST, query="\ud800"), "invalid_field"),
    (dict(ATLAS_REQUEST, principal="maya\udfff"), "invalid_field"),
])
def test_bad_requests_get_their_code(body, code):
    with pytest.raises(ParseError) as err:
        parse_request(body)
    assert err.value.code == code and err.value.status == 400
    assert err.value.as_dict()["error"]["pass"] == "parse" and len(err.value.message) > 20


def test_live_and_explicit_requests_have_different_plan_keys():
    explicit = parse_request(ATLAS_REQUEST)
    live = parse_request({k: v for k, v in ATLAS_REQUEST.items() if k != "decision_time"})
    assert live.live and not explicit.live
    assert plan_key(live, "ATLAS-IN-01") != plan_key(explicit, "ATLAS-IN-01")
    assert parse_request(dict(ATLAS_REQUEST, decision_time="now")).live


@pytest.mark.parametrize("budget, limit", [
    ({"tokens": 2**63}, "FRESHPLAN_MAX_BUDGET_TOKENS"), ({"tokens": 2**64}, "FRESHPLAN_MAX_BUDGET_TOKENS"),
    ({"tokens": 10**40}, "1000000000"), ({"calls": 1e300}, "FRESHPLAN_MAX_BUDGET_CALLS"),
    ({"latency_ms": 2**70}, "86400000"), ({"money": 1e300}, "1000000000000.0"),
])
def test_budgets_past_their_maximum_get_422_naming_the_limit(budget, limit):
    with pytest.raises(ParseError) as err:
        parse_request(dict(ATLAS_REQUEST, budget=budget), Limits())
    assert err.value.code == "budget_too_large" and err.value.status == 422 and limit in err.value.message


def test_query_is_capped_in_utf8_bytes_and_limits_are_configurable():
    parse_request(dict(ATLAS_REQUEST, query="é" * 2048), Limits())
    with pytest.raises(ParseError) as err:
        parse_request(dict(ATLAS_REQUEST, query="é" * 2049), Limits())
    assert err.value.code == "field_too_large" and err.value.status == 422 and "4096" in err.value.message
    assert parse_request(dict(ATLAS_REQUEST, budget={"tokens": 2**40}), Limits(tokens=2**41)).budget.tokens == 2**40
    # Stored requests recompile without limits, so lowering one drops no plan.
    assert parse_request(dict(ATLAS_REQUEST, query="x" * 10_000)).query == "x" * 10_000


@pytest.mark.parametrize("raw, code", [
    (b"[" * 33 + b"]" * 33, "body_too_deep"), (b'{"a":' * 40 + b"1" + b"}" * 40, "body_too_deep"),
    (b"[" * 100_000, "malformed_json"), (b'{"budget": {"tokens": NaN}}', "malformed_json"),
    (b'{"budget": {"tokens": Infinity}}', "malformed_json"),
])
def test_request_bodies_are_strict_json_of_bounded_depth(raw, code):
    with pytest.raises(ParseError) as err:
        decode_body(raw)
    assert err.value.code == code and err.value.status == 400


def test_integers_past_64_bits_decode_as_numbers_that_the_budget_refuses():
    body = decode_body(orjson.dumps(ATLAS_REQUEST)[:-1] + b', "budget": {"tokens": 1' + b"0" * 30 + b"}}")
    with pytest.raises(ParseError) as err:
        parse_request(body, Limits())
    assert err.value.code == "budget_too_large"


def test_a_body_at_the_depth_limit_decodes():
    doc = decode_body(b"[" * 32 + b"]" * 32, Limits())
    for _ in range(31):
        [doc] = doc
    assert doc == []
