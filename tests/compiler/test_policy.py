"""Cedar fails closed: any evaluation error denies; numbers reach Cedar as values that compare."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.errors import PolicyError
from compiler.policy import (Unrepresentable, authorise, cedar_value, compile_policy, principal_representable,
                             static_problem)
from schemas.records import PolicyBundle, Principal, Resource

WHEN = datetime(2026, 8, 30, tzinfo=timezone.utc)
PERMIT = "permit(principal, action, resource);\n"
MAYA = Principal("maya", ("credit_analyst",))


def policy(text: str):
    return compile_policy(PolicyBundle("b", 1, WHEN, text, ()))


def item(rid: str, **attributes) -> Resource:
    return Resource(rid, 1, "E", "approved_waiver", 10, attributes=attributes)


def verdict(text: str, *resources: Resource, principal: Principal = MAYA):
    result = authorise(policy(text), principal, resources, purpose="p", decision_type="d", decision_time=WHEN)
    return list(result.allowed), list(result.errors)


def test_a_forbid_that_errors_denies_instead_of_letting_the_permit_win():
    text = PERMIT + "forbid(principal, action, resource) when { resource.legal_hold == true };"
    assert verdict(text, item("null-hold", legal_hold=None), item("clear", legal_hold=False)) == (
        [False, True], [True, False])


def test_a_permit_that_errors_denies_even_when_another_permit_allows():
    text = PERMIT + "permit(principal, action, resource) when { resource.level > 3 };"
    assert verdict(text, item("text-level", level="high"), item("no-level")) == ([False, False], [True, True])
    assert verdict(text, item("int-level", level=5)) == ([True], [False])


def test_a_decimal_compared_with_an_operator_errors_and_denies():
    text = PERMIT + "forbid(principal, action, resource) when { resource.risk_score >= 8 };"
    assert verdict(text, item("risky", risk_score=9.5), item("safe-float", risk_score=2.5),
                   item("safe-int", risk_score=2)) == ([False, False, True], [True, True, False])


def test_decimal_methods_compare_floats_as_authors_expect():
    text = PERMIT + ('forbid(principal, action, resource) when '
                     '{ resource.risk_score.greaterThanOrEqual(decimal("8.0")) };')
    assert verdict(text, item("risky", risk_score=9.5), item("edge", risk_score=8.0),
                   item("safe", risk_score=7.99)) == ([False, False, True], [False, False, False])


def test_an_unrepresentable_value_denies_only_its_candidate():
    text = PERMIT
    huge, escaped = item("huge", n=2**63), item("escape", owner={"__entity": {"type": "User", "id": "root"}})
    assert verdict(text, huge, escaped, item("fine", n=1.5, tags=["a", None])) == ([False, False, True],
                                                                                  [True, True, False])
    assert verdict(text, item("fine"), principal=Principal("maya", (), {"score": float("inf")})) == ([False], [True])


def test_the_engine_failing_denies_everything():
    bad = policy(PERMIT)
    object.__setattr__(bad, "policy_set", "permit(")   # not a policy set: the batch call raises
    result = authorise(bad, MAYA, [item("a")], purpose="p", decision_type="d", decision_time=WHEN)
    assert result.allowed == (False,) and result.errors == (True,)


@pytest.mark.parametrize("value, expected", [
    (9.5, {"__extn": {"fn": "decimal", "arg": "9.5000"}}),
    (0.12345, {"__extn": {"fn": "decimal", "arg": "0.1234"}}),
    (1e14, {"__extn": {"fn": "decimal", "arg": "100000000000000.0000"}}),
    (7, 7), (True, True), ({"a": None, "b": [1, None]}, {"b": [1]}),
])
def test_cedar_values(value, expected):
    assert cedar_value(value) == expected


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, float("nan"), 1e300, {"__extn": {}}, object()])
def test_values_cedar_cannot_hold_are_refused(value):
    with pytest.raises(Unrepresentable):
        cedar_value(value)


@pytest.mark.parametrize("text, problem", [
    ('permit(principal, action, resource) when { resource.r >= decimal("8.0") };', "greaterThanOrEqual"),
    ('permit(principal, action, resource) when { decimal("8.0") < resource.r };', "lessThan"),
    ("permit(principal, action, resource) when { resource.r.lessThan(8) };", "integer literal"),
    ('permit(principal, action, resource) when { resource.r == decimal("1.23456") };', "four fractional"),
    ('permit(principal, action, resource) when { resource.r == decimal("8") };', "four fractional"),
])
def test_comparisons_that_can_never_evaluate_are_found(text, problem):
    assert problem in static_problem(text)
    with pytest.raises(PolicyError):
        policy(text)
    assert compile_policy(PolicyBundle("b", 1, WHEN, text, ()), strict=False).version == 1


def test_sound_bundles_pass_the_static_checks():
    assert static_problem(PERMIT + 'forbid(principal, action, resource) when { resource.r.lessThan(decimal("-0.5"))'
                          ' || resource.n >= 8 || context.decision_time < 5 };') is None


def test_representability_is_asked_of_cedar_once_per_distinct_attributes(monkeypatch):
    import compiler.policy as policy

    calls = []
    real = policy.cedarpy.is_authorized_batch
    monkeypatch.setattr(policy.cedarpy, "is_authorized_batch", lambda *args: calls.append(1) or real(*args))
    policy._representable_json.cache_clear()
    assert principal_representable({"desk": "d1", "level": 3, "tags": ["a"], "on": True, "gone": None})
    assert not calls  # flat strings, Longs, booleans and sets of strings: answered without Cedar
    assert principal_representable({"desk": "d1", "level": 3.0}) and len(calls) == 1  # a decimal: to Cedar
    assert principal_representable({"level": 3.0, "desk": "d1"}) and len(calls) == 1  # key order: the same question
    assert principal_representable({"desk": {"floor": 3}}) and len(calls) == 2  # a record: to Cedar
    assert not principal_representable({"n": 2**63}) and not principal_representable({"n": 2**63})
    assert not principal_representable({"n": 2**70})  # past what JSON encodes here: asked without the memo
    assert not principal_representable({"__entity": "x"})  # a reserved key is never plain
    assert len(calls) == 2  # none of those reached Cedar: the conversion refused them
    # A lone surrogate is not plain text: Cedar is asked, and refuses it.
    assert not principal_representable({"a": "\ud800"}) and not principal_representable({"\ud800": "a"})
    assert len(calls) == 4


_ANY_CHAR = st.characters(blacklist_categories=())  # lone surrogates too: a Python string can hold them
_PLAIN = st.dictionaries(st.text(_ANY_CHAR, max_size=8), st.one_of(
    st.text(_ANY_CHAR, max_size=12), st.booleans(), st.none(), st.integers(min_value=-(2**64), max_value=2**64),
    st.lists(st.text(_ANY_CHAR, max_size=6), max_size=3)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(_PLAIN)
def test_attributes_answered_without_cedar_are_ones_cedar_holds(attributes):
    import compiler.policy as policy

    # Never a yes that Cedar would refuse: a principal Cedar cannot hold must be denied everything.
    if policy._plain(attributes):
        assert policy._representable(attributes)
