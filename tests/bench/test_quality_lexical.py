"""The 003 protocol's scope guard, router and weighted lexical score."""

from __future__ import annotations

from bench.quality.fixtures import Doc
from bench.quality.lexical import out_of_scope, rank, route, score

DOC = Doc("atlas-x", "atlas", "finance", "Meal expense cap", ("dinner", "cap"), "Client dinners up to 80.", ())


def test_scope_guard_matches_whole_tenant_names_in_any_case():
    assert out_of_scope("ATLAS and bOrEaL meal caps?", "atlas") == ["boreal"]
    assert out_of_scope("What is boreal's meal cap?", "atlas") == ["boreal"]
    assert out_of_scope("Borealis meal cap for atlas", "atlas") == []
    assert out_of_scope("ｂｏｒｅａｌ meal cap", "atlas") == ["boreal"]      # full-width letters normalise


def test_router_returns_none_on_a_tie_rather_than_guessing():
    assert route("Which access systems does a new hire get?") is None
    assert route("What is the dinner cap?") == "finance"
    assert route("limit") is None


def test_title_keyword_and_body_weigh_three_two_one():
    assert score("meal", DOC) == 3 and score("dinner", DOC) == 2 + 0 and score("client", DOC) == 1
    assert score("cap", DOC) == 3 + 2 and score("what is the", DOC) == 0
    assert rank("unrelated words", [DOC]) == []
