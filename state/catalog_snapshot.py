"""A memoising read view of the catalog for batch work (recompiling a fan-out)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Sequence

import orjson

from compiler import dependency_keys as dk
from compiler.policy import CompiledPolicy
from schemas.records import Contract, Principal, Resource
from schemas.timefmt import parse_instant
from state.catalog import Catalog


class CatalogSnapshot:
    """A memoising view over the catalog for work that reads it many times without writing.

    Recompiling a batch asks for the same contract, principal and entity again and again;
    each answer costs a DuckDB statement. Valid only until the catalog next changes.
    """

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._memo: dict[tuple, object] = {}

    def _get(self, key: tuple, load):
        if key not in self._memo:
            self._memo[key] = load()
        return self._memo[key]

    def entity_matches(self, name: str) -> Sequence[str]:
        """As `Catalog.entity_matches`, memoised."""
        return self._get(("entity", name), lambda: self.catalog.entity_matches(name))

    def principal(self, principal_id: str) -> Principal | None:
        """As `Catalog.principal`, memoised."""
        return self._get(("principal", principal_id), lambda: self.catalog.principal(principal_id))

    def contract(self, decision_type: str, at: datetime | None = None) -> tuple[Contract, CompiledPolicy] | None:
        """As `Catalog.contract`, memoised per decision type and time."""
        rows = self._get(("versions", decision_type), lambda: self.catalog.versions(decision_type))
        return self._get(("contract", decision_type, at), lambda: self.catalog.contract_in(decision_type, rows, at))

    def policy_took_over(self, dep_key: str, request: dict | str, now: datetime | None) -> bool:
        """Whether crossing a live plan's `time:` key put another bundle version in charge of its decision.

        A live plan's time key is its earliest change: a record's validity or age, or a later
        policy version taking over; only the second changes the governing version.
        """
        key = dk.parse(dep_key)
        if key.kind != dk.TIME or now is None:
            return False
        try:
            decision_type = (orjson.loads(request) if isinstance(request, str) else request)["decision_type"]
            before = parse_instant(key.value) - timedelta(seconds=1)
        except (KeyError, TypeError, ValueError, orjson.JSONDecodeError):
            return False
        governing = [self.contract(decision_type, at) for at in (before, now)]
        return len({found and (found[1].bundle_id, found[1].version) for found in governing}) > 1

    def decision_types(self) -> Sequence[str]:
        """As `Catalog.decision_types`, memoised."""
        return self._get(("decision_types",), self.catalog.decision_types)

    def candidates(self, entity_id: str, contract: Contract) -> Sequence[Resource]:
        """As `Catalog.candidates`, memoised per entity and contract."""
        return self._get(("candidates", entity_id, id(contract)), lambda: self.catalog.candidates(entity_id, contract))

    def entities_named(self, names: Sequence[str]) -> dict[str, list[str]]:
        """As `Catalog.entities_named` (which the writer's store remembers by name)."""
        return self.catalog.entities_named(names)

    def trusted_sources(self) -> dict[str, frozenset[str]]:
        """As `Catalog.trusted_sources`, memoised."""
        return self._get(("trusted",), self.catalog.trusted_sources)

    def prefetch(self, requests: Sequence[dict], now: datetime | None = None) -> None:
        """Resolve many requests' principals and entities together; candidates in one statement per decision type.

        Each request's contract is the one in effect at its decision_time, or at `now` (default:
        the store's) when live.
        """
        now = now or self.catalog.store.now()
        pids = {r["principal"] for r in requests if isinstance(r.get("principal"), str)}
        if len(pids) > 1:
            found = self.catalog.principals_many(sorted(pids))
            for pid in pids:
                self._memo.setdefault(("principal", pid), found.get(pid))
        names = sorted({r["entity"] for r in requests if isinstance(r.get("entity"), str)})
        if len(names) > 1:
            for name, ids in self.catalog.entity_matches_many(names).items():
                self._memo.setdefault(("entity", name), ids)
        by_contract: dict[int, tuple[Contract, set[str]]] = {}
        for r in requests:
            if isinstance(r.get("decision_type"), str) and isinstance(r.get("entity"), str):
                found = self.contract(r["decision_type"], _when(r, now))
                if found is not None:
                    by_contract.setdefault(id(found[0]), (found[0], set()))[1].add(r["entity"])
        for contract, names in by_contract.values():
            if len(names) < 2:
                continue
            for entity_id, resources in self.catalog.candidates_many(sorted(names), contract).items():
                # Names that are aliases simply miss this memo and are fetched on their own.
                self._memo.setdefault(("candidates", entity_id, id(contract)), resources)


def _when(request: dict, now: datetime | None) -> datetime | None:
    """The instant a stored request decides at (a malformed one: now; compiling it will refuse it)."""
    try:
        return parse_instant(request["decision_time"]) if request.get("decision_time") else now
    except (TypeError, ValueError):
        return now
