"""A memoising read view of the catalog for batch work (recompiling a fan-out)."""

from __future__ import annotations

from typing import Sequence

from compiler.policy import CompiledPolicy
from schemas.records import Contract, Principal, Resource
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

    def contract(self, decision_type: str) -> tuple[Contract, CompiledPolicy] | None:
        """As `Catalog.contract`, memoised (the same Contract object each time)."""
        return self._get(("contract", decision_type), lambda: self.catalog.contract(decision_type))

    def decision_types(self) -> Sequence[str]:
        """As `Catalog.decision_types`, memoised."""
        return self._get(("decision_types",), self.catalog.decision_types)

    def candidates(self, entity_id: str, contract: Contract) -> Sequence[Resource]:
        """As `Catalog.candidates`, memoised per entity and contract."""
        return self._get(("candidates", entity_id, id(contract)), lambda: self.catalog.candidates(entity_id, contract))

    def entities_named(self, names: Sequence[str]) -> dict[str, list[str]]:
        """As `Catalog.entities_named` (query text varies too much to memoise)."""
        return self.catalog.entities_named(names)

    def trusted_sources(self) -> dict[str, frozenset[str]]:
        """As `Catalog.trusted_sources`, memoised."""
        return self._get(("trusted",), self.catalog.trusted_sources)

    def prefetch(self, requests: Sequence[dict]) -> None:
        """Resolve many requests' entities in one statement, and load their candidates in one per decision type."""
        names = sorted({r["entity"] for r in requests if isinstance(r.get("entity"), str)})
        if len(names) > 1:
            for name, ids in self.catalog.entity_matches_many(names).items():
                self._memo.setdefault(("entity", name), ids)
        by_type: dict[str, set[str]] = {}
        for r in requests:
            if isinstance(r.get("decision_type"), str) and isinstance(r.get("entity"), str):
                by_type.setdefault(r["decision_type"], set()).add(r["entity"])
        for decision_type, names in by_type.items():
            found = self.contract(decision_type)
            if found is None or len(names) < 2:
                continue
            for entity_id, resources in self.catalog.candidates_many(sorted(names), found[0]).items():
                # Names that are aliases simply miss this memo and are fetched on their own.
                self._memo.setdefault(("candidates", entity_id, id(found[0])), resources)
