"""An in-memory catalog view for unit tests of the pure compiler (no broker, no database)."""

from __future__ import annotations

from pathlib import Path

import orjson

from compiler.policy import compile_policy
from schemas.codec import decode
from schemas.records import Contract, Entity, PolicyBundle, Principal, Resource, SourceChange

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


class MemoryCatalog:
    """Applies decoded scenario events to dictionaries; implements compiler.pipeline.CatalogView."""

    def __init__(self) -> None:
        self.resources: dict[str, Resource] = {}
        self.principals: dict[str, Principal] = {}
        self.entities: dict[str, Entity] = {}
        self.contracts: dict[str, tuple] = {}
        self.sources: dict[str, dict[str, tuple[str, ...]]] = {}

    @classmethod
    def from_scenario(cls, name: str) -> "MemoryCatalog":
        catalog = cls()
        for line in (SCENARIOS / name).read_text().splitlines():
            if line.strip():
                item = orjson.loads(line)
                catalog.apply(item["topic"], orjson.dumps(item["event"]))
        return catalog

    def apply(self, topic: str, raw: bytes) -> None:
        payload = decode(topic, None, raw).payload
        if isinstance(payload, SourceChange):
            table = {"resource": self.resources, "principal": self.principals,
                     "entity": self.entities}[payload.kind]
            if payload.record is None:
                table.pop(payload.record_id, None)
            else:
                table[payload.record_id] = payload.record
        elif isinstance(payload, PolicyBundle):
            policy = compile_policy(payload)
            self.sources[payload.bundle_id] = dict(payload.sources)
            for contract in payload.contracts:
                self.contracts[contract.decision_type] = (contract, policy)

    def entity_matches(self, name: str):
        low = name.lower()
        return [e.id for e in self.entities.values()
                if e.id == name or low in (a.lower() for a in e.aliases)]

    def principal(self, principal_id: str):
        return self.principals.get(principal_id)

    def contract(self, decision_type: str, at=None):
        return self.contracts.get(decision_type)

    def decision_types(self):
        return list(self.contracts)

    def candidates(self, entity_id: str, contract: Contract):
        classes = {c for p in contract.propositions for c in p.accepted_classes}
        props = {p.id for p in contract.propositions}
        return sorted((r for r in self.resources.values() if r.entity == entity_id and (
            r.evidence_class in classes or props & (set(r.supports) | set(r.contradicts)))),
            key=lambda r: r.id)

    def entities_named(self, names):
        out = {}
        for name in names:
            ids = sorted(e.id for e in self.entities.values()
                         if name.lower() in {e.id.lower(), *(a.lower() for a in e.aliases)})
            if ids:
                out[name] = ids
        return out

    def trusted_sources(self):
        out = {}
        for rules in self.sources.values():
            for group, classes in rules.items():
                for cls in classes:
                    out.setdefault(cls, set()).add(group)
        return {cls: frozenset(groups) for cls, groups in out.items()}
