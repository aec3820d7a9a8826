"""Pass 2's scope guard: names of entities found whole in query text, in any case."""

from __future__ import annotations

from compiler.resolve import out_of_scope, query_names, query_words


def test_names_are_runs_of_whole_words_in_any_case():
    names = query_names("What is Boreal's travel-class rule for Orion Ltd?")
    assert {"boreal", "travel-class", "orion ltd", "what is boreal"} <= set(names)
    assert "bore" not in names and "oreal" not in names and "s travel" in names
    assert query_names("") == [] and query_words("A a b") == ["a", "b"]


def test_another_entity_named_puts_the_request_out_of_scope():
    assert out_of_scope("ATLAS-IN-01", {"boreal": ["BOREAL-UK-02"]})
    assert not out_of_scope("ATLAS-IN-01", {"atlas": ["ATLAS-IN-01"]})
    # A name the request's own entity shares is read as meaning it.
    assert not out_of_scope("ATLAS-IN-01", {"atlas": ["ATLAS-IN-01", "ATLAS-US-09"]})
    assert not out_of_scope("ATLAS-IN-01", {})
