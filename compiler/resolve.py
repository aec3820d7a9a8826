"""Passes 2 and 3, resolve and type-check: canonical ids and the contract, never a guess."""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from compiler.errors import ResolveError, TypeCheckError
from schemas.records import Contract, Principal


def resolve_entity(name: str, matches: Iterable[str]) -> str:
    """The one canonical entity id that `name` denotes, given every id it matched by id or alias."""
    found = sorted(set(matches))
    if not found:
        raise ResolveError("unknown_entity", f"No entity is known by the id or alias '{name}'; use a "
                           "canonical entity id or register the alias on source-changes.", status=404)
    if len(found) > 1:
        raise ResolveError("ambiguous_entity", f"'{name}' names {len(found)} entities "
                           f"({', '.join(found)}); send the canonical entity id instead.", status=409)
    return found[0]


def resolve_principal(principal_id: str, principal: Principal | None) -> tuple[Principal, bool]:
    """The principal record and whether the catalog knows it.

    An unknown principal is not refused: a refusal would tell any caller which principals
    exist. It is answered as a principal without rights is (every candidate withheld), and the
    plan depends on the principal's key, so publishing the principal invalidates it.
    """
    if principal is None:
        return Principal(id=principal_id, roles=()), False
    return principal, True


def type_check(decision_type: str, purpose: str, contract: Contract | None,
               known: Iterable[str]) -> Contract:
    """The evidence contract of the decision type, checked against the purpose."""
    if contract is None:
        known = ", ".join(sorted(known)) or "none yet"
        raise TypeCheckError("unknown_decision_type", f"Decision type '{decision_type}' is not in the "
                             f"current decision catalogue (known: {known}).", status=422)
    if purpose not in contract.purposes:
        raise TypeCheckError("purpose_not_allowed", f"Purpose '{purpose}' is not allowed for "
                             f"'{decision_type}'; allowed: {', '.join(contract.purposes)}.", status=422)
    return contract


# Aliases longer than this many words are not looked for in query text.
MAX_NAME_WORDS = 8
_WORD = re.compile(r"\w+")


def query_words(query: str) -> list[str]:
    """The distinct lower-cased words of a query, sorted."""
    return sorted({w.lower() for w in _WORD.findall(query)})


def query_names(query: str) -> list[str]:
    """Every run of up to MAX_NAME_WORDS whole words of the query, lower-cased, as typed between them.

    A run starts at a word's first character and ends at a word's last, so an alias such as
    `Atlas-India` or `Orion Ltd` is found whole, and `Bore` is never found inside `Boreal`.
    """
    spans = [m.span() for m in _WORD.finditer(query)]
    names = set()
    for i, (start, _) in enumerate(spans):
        for _, end in spans[i:i + MAX_NAME_WORDS]:
            names.add(query[start:end].lower())
    return sorted(names)


def out_of_scope(entity_id: str, named: Mapping[str, Sequence[str]]) -> bool:
    """Whether the query names some entity other than the request's, by id or alias.

    A name shared with the request's own entity is read as meaning it, not as a second tenant.
    """
    return any(ids and entity_id not in ids for ids in named.values())
