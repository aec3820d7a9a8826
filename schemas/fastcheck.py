"""Cheaper in-memory rewrites of the input schemas that accept exactly what the published ones accept."""

from __future__ import annotations

import copy
from typing import Any, Callable

# Keywords that constrain only values of their own type, so they let null through untouched.
_TYPE_SCOPED = frozenset({"type", "format", "minLength", "maxLength", "pattern", "minimum", "maximum",
                          "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "description"})
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_NULL = {"type": "null"}

Resolve = Callable[[str], Any]


def without_nullable_one_of(node: Any, resolve: Resolve) -> Any:
    """Rewrite every `{"oneOf": [X, {"type": "null"}]}` whose X cannot be null.

    fastjsonschema runs every oneOf branch and raises in the losing one; when X has a non-null
    `type`, at most one branch can match, so oneOf equals anyOf, and for a type-scoped X equals
    X with `"type": [T, "null"]`, which raises nothing.
    """
    if isinstance(node, list):
        return [without_nullable_one_of(item, resolve) for item in node]
    if not isinstance(node, dict):
        return node
    branches = node.get("oneOf")
    if set(node) == {"oneOf"} and isinstance(branches, list) and len(branches) == 2 and _NULL in branches:
        other = branches[1 - branches.index(_NULL)]
        target = resolve(other["$ref"]) if set(other) == {"$ref"} else other
        kind = target.get("type") if isinstance(target, dict) and "$ref" not in target else None
        if isinstance(kind, str) and kind != "null":
            if set(target) <= _TYPE_SCOPED:
                return dict(target, type=[kind, "null"])
            return {"anyOf": [without_nullable_one_of(other, resolve), _NULL]}
    return {key: value if key in _DATA_KEYWORDS else without_nullable_one_of(value, resolve)
            for key, value in node.items()}


def discriminator(schema: dict) -> tuple[str, list[str]] | None:
    """The property whose string const tells the top-level oneOf branches apart, with its values."""
    branches = schema.get("oneOf")
    if not isinstance(branches, list) or not branches:
        return None
    names, values = set(), []
    for branch in branches:
        consts = {name: sub["const"] for name, sub in (branch.get("properties") or {}).items()
                  if isinstance(sub, dict) and isinstance(sub.get("const"), str)}
        if len(consts) != 1:
            return None
        (name, value), = consts.items()
        names.add(name)
        values.append(value)
    if len(names) != 1 or len(set(values)) != len(values):
        return None
    return names.pop(), values


def per_branch(schema: dict, name: str, value: str) -> dict:
    """The schema as it applies to a document whose `name` property is present and equals `value`.

    Only the branch whose const is `value` can match such a document, so oneOf over all
    branches equals oneOf over that one; an `if` demanding another const there never holds,
    so its `then` is dropped.
    """
    branches = schema["oneOf"]
    narrowed = copy.deepcopy(schema)
    narrowed["oneOf"] = [copy.deepcopy(b) for b in branches if b["properties"][name]["const"] == value]
    cond = schema.get("if")
    if isinstance(cond, dict) and "else" not in schema:
        wanted = ((cond.get("properties") or {}).get(name) or {})
        if isinstance(wanted, dict) and isinstance(wanted.get("const"), str) and wanted["const"] != value:
            narrowed.pop("if")
            narrowed.pop("then", None)
    return narrowed


def dispatching(schema: dict, resolve: Resolve, compile_: Callable[[dict], Callable]) -> Callable[[Any], Any]:
    """A validator that picks the oneOf branch by discriminator; any other document gets the whole schema."""
    whole = without_nullable_one_of(schema, resolve)
    fallback = compile_(whole)
    found = discriminator(whole)
    if found is None:
        return fallback
    name, values = found
    by_value = {value: compile_(per_branch(whole, name, value)) for value in values}

    def check(doc: Any) -> Any:
        picked = doc.get(name) if isinstance(doc, dict) else None
        return (by_value.get(picked, fallback) if isinstance(picked, str) else fallback)(doc)

    return check
