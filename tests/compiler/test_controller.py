"""The adaptive retrieval controller: routes, rewrites, budgets and stop reasons, with no broker or database."""

from __future__ import annotations

from compiler import controller as c
from compiler.relevance import query_terms
from schemas.records import Contract, Proposition, Resource


def doc(i: str, title: str, content: str, route: str | None = None) -> Resource:
    attrs = {"route": route} if route else {}
    return Resource(id=i, version=1, entity="t", evidence_class="policy", tokens=10, title=title,
                    content=content, supports=("stated",), attributes=attrs)


POOL = [doc("meal", "Meal expense cap", "Client dinners may be expensed up to 80 USD.", "finance"),
        doc("leave", "Annual leave carryover", "Five unused leave days carry over.", "people"),
        doc("mfa", "Multi-factor login", "Every login needs a hardware key.", "security"),
        doc("keys", "Secret key rotation", "Secret keys rotate every 90 days.", "security")]
ROUTES = (("finance", frozenset({"meal", "dinner", "supper", "expense"})),
          ("people", frozenset({"leave", "pto", "vacation"})),
          ("security", frozenset({"login", "key", "secret"})))


def settings(**kw) -> c.Settings:
    return c.Settings(**{"routes": ROUTES, **kw})


def test_the_route_with_most_hints_wins_and_a_tie_routes_nowhere():
    assert c.route(frozenset({"supper", "expense"}), ROUTES) == "finance"
    assert c.route(frozenset({"pto", "login"}), ROUTES) is None          # never alphabetically
    assert c.route(frozenset({"parking"}), ROUTES) is None


def test_strong_support_stops_after_one_routed_retrieval_scoring_only_the_route():
    out = c.run("How often do secret keys rotate?", POOL, settings(), threshold=2.0)
    assert out.stop == c.SUPPORT_SUFFICIENT and out.retrievals == 1 and out.sufficient
    assert out.retrieved[0][0].id == "keys"
    assert out.scored == 2                      # the security route's two candidates, not the pool's four
    assert [e["step"] for e in out.trace] == ["route", "retrieve", "assess", "stop"]


def test_weak_support_is_rewritten_by_a_public_rule_and_retrieved_again():
    rules = (c.rule(["pto"], ["annual", "leave", "carryover"]),)
    weak = c.run("How much PTO rolls over?", POOL, settings(max_retrievals=2), threshold=2.0)
    assert weak.stop == c.NO_REWRITE and not weak.sufficient
    out = c.run("How much PTO rolls over?", POOL, settings(rules=rules), threshold=2.0)
    assert out.stop == c.SUPPORT_SUFFICIENT and out.retrievals == 2 and out.retrieved[0][0].id == "leave"
    rewrite = next(e for e in out.trace if e["step"] == "rewrite")
    assert rewrite["added"] == ["annual", "carryover", "leav"] and rewrite["rules"] == [0]


def test_each_budget_and_a_loop_stop_the_controller_with_its_own_reason():
    rules = (c.rule(["pto"], ["holiday"]),)
    one = c.run("pto rules", POOL, settings(rules=rules, max_retrievals=1), threshold=2.0)
    assert one.stop == c.RETRIEVAL_BUDGET and one.retrievals == 1
    tight = c.run("pto rules", POOL, settings(rules=rules, max_transitions=1), threshold=2.0)
    assert tight.stop == c.TRANSITION_BUDGET and tight.retrievals == 0 and not tight.sufficient
    swing = (c.rule(["pto"], ["holiday"], drop=True), c.rule(["holiday"], ["pto"], drop=True))
    loop = c.run("pto", POOL, settings(rules=swing[:1] + swing[1:], max_retrievals=20, max_transitions=100),
                 threshold=2.0)
    assert loop.stop == c.LOOP_DETECTED and loop.retrievals < 20


def test_settings_come_from_the_catalogue_with_the_issue_defaults():
    base = Contract("d", ("p",), (Proposition("stated", ("policy",)),))
    assert c.settings_of(base) == c.ONE_SHOT
    from dataclasses import replace
    s = c.settings_of(replace(base, controller={"routes": {"b": ["X"], "a": ["y"]},
                                                "rewrites": [{"when": ["Q"], "add": ["r"]}]}))
    assert (s.max_retrievals, s.max_transitions, s.per_retrieval) == (2, 9, 3)
    assert s.routes == (("a", frozenset({"y"})), ("b", frozenset({"x"}))) and s.rules[0].when == (frozenset({"q"}),)
    hyphen = c.rule(["no-show"], ["missed appointments"])
    assert c.rewrite(frozenset({"no", "show", "fee"}), [hyphen])[0] == {"no", "show", "fee", "miss", "appointment"}


def test_the_policy_versions_schema_takes_the_new_catalogue_fields_and_old_bundles_stay_valid():
    import orjson
    import pytest

    from schemas.codec import decode
    from schemas.errors import InvalidEvent

    old = {"event_id": "p-1", "schema_version": 1, "occurred_at": "2026-01-01T00:00:00Z", "bundle_id": "b",
           "version": 1, "effective_at": "2026-01-01T00:00:00Z", "cedar": "permit(principal, action, resource);",
           "decision_types": {"d": {"purposes": ["p"], "propositions": [{"id": "x", "accepted_classes": ["c"]}]}}}
    assert decode("policy-versions", None, orjson.dumps(old)).payload.contracts[0].controller is None
    new = orjson.loads(orjson.dumps(old))
    new["decision_types"]["d"].update(min_relevance=3.5, ask_scope=True, controller={
        "routes": {"r": ["w"]}, "rewrites": [{"when": ["a"], "add": ["b"], "drop": True}], "max_retrievals": 3,
        "max_transitions": 12, "candidates_per_retrieval": 5, "min_coverage": 0.25})
    contract = decode("policy-versions", None, orjson.dumps(new)).payload.contracts[0]
    s = c.settings_of(contract)
    assert contract.min_relevance == 3.5 and contract.ask_scope
    assert (s.max_retrievals, s.max_transitions, s.per_retrieval, s.min_coverage) == (3, 12, 5, 0.25)
    new["decision_types"]["d"]["controller"]["retries"] = 1
    with pytest.raises(InvalidEvent):
        decode("policy-versions", None, orjson.dumps(new))


def test_temporal_glue_carries_no_topic_as_after_and_before_never_did():
    assert query_terms("How long until a patient can obtain their chart?") == {"long", "patient", "obtain", "chart"}
    assert query_terms("refunds before, after, until, while or since the visit") == {"refund", "visit"}
