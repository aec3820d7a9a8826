"""Pass 1: malformed requests are refused with a code and a sentence, never guessed at."""

from __future__ import annotations

import pytest

from compiler.errors import ParseError
from compiler.request import parse_request, plan_key
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
