"""The catalog in DuckDB: apply source, policy and revocation events; serve the compiler's view."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Callable, Collection, Sequence

import orjson

from compiler import dependency_keys as dk
from compiler.errors import PolicyError
from compiler.evsi import ModelError, decision_model
from compiler.policy import CompiledPolicy, compile_policy
from schemas.codec import contract_from
from schemas.errors import InvalidEvent
from schemas.records import Contract, PolicyBundle, Principal, Resource, Revocation, SourceChange
from state.catalog_identities import IDENTITY_MEMO, Identity, apply_identities, revocation_applies
from state.catalog_resources import (RESOURCE_COLS, Mine, OtherShard, apply_resources, everything, live_resources,
                                     resource_row)
from state.lookups import remember
from state.policy_history import governing, keep_version, versions_of
from state.store import Store

# What the writer's store remembers for the catalog (`Store.cached`), by what makes it stale.
POLICY_MEMO = ("catalog.rules", "catalog.policy_texts", "catalog.trusted", "catalog.versions",
               "catalog.decision_types")

class Catalog:
    """Resources, principals, entities and policy bundles; implements the compiler's CatalogView."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db
        self._policies: dict[tuple[str, int], CompiledPolicy] = {}
        self._contracts: dict[tuple[str, int, str], Contract] = {}  # versions never change once kept
        self._migrate()

    def _migrate(self) -> None:
        """Files written before `observed_at` get the column, NULL: those rows age from `valid_from` as before.

        Files written before `log_tick` and `log_snapshot` get them, NULL: a log-ordered row's tick is
        then its version's (none was raised above it), and no stored row is a snapshot row.
        """
        columns = {r[0] for r in self.db.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'resources'").fetchall()}
        added = [(name, kind) for name, kind in (("observed_at", "TIMESTAMPTZ"), ("log_tick", "BIGINT"),
                                                 ("log_snapshot", "VARCHAR")) if name not in columns]
        for name, kind in added:
            self.db.execute(f"ALTER TABLE resources ADD COLUMN {name} {kind}")
        if added:
            self.db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL

    def forget_cached(self) -> None:
        """Drop what was read inside a transaction that rolled back (the store drops it too, at the rollback)."""
        self.store.forget(*POLICY_MEMO, *IDENTITY_MEMO)

    # -- applying events: each returns the dependency keys it touched ------------------

    def apply_source_change(self, change: SourceChange, at: datetime | None = None) -> list[str] | None:
        """Apply an upsert or delete made at event time `at` (None: unknown); None when older than stored."""
        if change.kind == "resource":
            result = self.apply_resources([change])[0]
        else:
            result = self.apply_identities([change], [at])[0]
        if isinstance(result, InvalidEvent):
            raise result
        return result

    def apply_resources(self, changes: Sequence[SourceChange], mine: Mine = everything,
                        left: dict[int, int] | None = None, lane_of: Callable[[str | None], int] | None = None,
                        ) -> list[list[str] | InvalidEvent | OtherShard | None]:
        """Apply resource upserts and deletes in order in one write; keys per change (see `apply_resources`)."""
        return apply_resources(self.store, changes, self._source_rules(), mine, left, lane_of)

    def live_resources(self, ids: Collection[str]) -> set[str]:
        """Of these resource ids, those stored and not deleted (see `live_resources`)."""
        return live_resources(self.store, ids)

    def source_rules(self) -> dict[str, set[str]]:
        """Provenance group -> the evidence classes it may assert under the policy bundles applied."""
        return self._source_rules()

    def _source_rules(self) -> dict[str, set[str]]:
        """Provenance group -> the evidence classes it may assert, read once per policy change."""
        def load() -> dict[str, set[str]]:
            rules: dict[str, set[str]] = {}
            for group, classes in self.db.execute("SELECT provenance_group, classes FROM source_rules").fetchall():
                rules.setdefault(group, set()).update(classes)
            return rules
        return self.store.cached("catalog.rules", load)

    def apply_identities(self, items: Sequence[Identity],
                         times: Sequence[datetime | None] | None = None) -> list[list[str] | InvalidEvent | None]:
        """Apply principal and entity changes and revocations in order, in bulk (see `apply_identities`)."""
        return apply_identities(self.store, items, times, self._stored_policy_texts)

    def _stored_policy_texts(self) -> list[str]:
        """Cedar texts of every kept bundle version, read once per policy change."""
        return self.store.cached("catalog.policy_texts", lambda: [
            r[0] for r in self.db.execute("SELECT cedar FROM policy_versions").fetchall()])

    def apply_policy(self, bundle: PolicyBundle) -> list[str] | None:
        """Keep a newer bundle version whole; a bundle whose Cedar fails to parse is rejected whole.

        Every version is kept: a decision uses the version in effect at its time (`contract`).
        """
        row = self.db.execute("SELECT max(version) FROM policy_versions WHERE bundle_id = ?",
                              [bundle.bundle_id]).fetchone()
        if row[0] is not None and bundle.version <= row[0]:
            return None
        try:
            compiled = compile_policy(bundle)
            for contract in bundle.contracts:
                decision_model(contract)
        except PolicyError as exc:
            # Cedar's parse errors quote the policy text; dead letters say what is wrong, not what it says.
            detail = getattr(exc, "detail", None)
            raise InvalidEvent("invalid_policy", f"cedar cannot evaluate: {detail}; the previous version stays active"
                               if detail else "cedar does not parse as Cedar policies (check it with the Cedar "
                               "CLI); the previous version stays active") from None
        except ModelError:
            raise InvalidEvent("invalid_policy", "a decision type's loss or observations do not form a decision "
                               "model (see docs/plans.md); the previous version stays active") from None
        names = [c.decision_type for c in bundle.contracts]
        owned = self.db.execute("SELECT decision_type, bundle_id FROM contracts WHERE decision_type IN "
                                "(SELECT unnest(?)) AND bundle_id <> ?", [names, bundle.bundle_id]).fetchall()
        if owned:
            # Silently re-homing a decision type would swap the contract and policy under other plans.
            raise InvalidEvent("decision_type_conflict", "decision types already defined by another bundle: "
                               + ", ".join(f"{d} (bundle {b})" for d, b in sorted(owned))
                               + "; retire them there first; the previous version stays active")
        self._policies[(bundle.bundle_id, bundle.version)] = compiled
        before = [r[0] for r in self.db.execute("SELECT decision_type FROM contracts WHERE bundle_id = ?",
                                                [bundle.bundle_id]).fetchall()]
        self.db.execute("DELETE FROM contracts WHERE bundle_id = ?", [bundle.bundle_id])
        types = {}
        for contract in bundle.contracts:
            body = _contract_doc(contract)
            types[contract.decision_type] = body
            self.db.execute("INSERT OR REPLACE INTO contracts VALUES (?, ?, ?)",
                            [contract.decision_type, bundle.bundle_id, orjson.dumps(body).decode()])
        trust_before = self.trusted_sources()
        self.db.execute("DELETE FROM source_rules WHERE bundle_id = ?", [bundle.bundle_id])
        for group, classes in bundle.sources.items():
            self.db.execute("INSERT INTO source_rules VALUES (?, ?, ?)", [bundle.bundle_id, group, list(classes)])
        self.store.forget(*POLICY_MEMO)
        trust_after = self.trusted_sources()
        trust_keys = [dk.trust(c) for c in sorted(set(trust_before) | set(trust_after))
                      if trust_before.get(c) != trust_after.get(c)]
        self.db.execute("INSERT OR REPLACE INTO policy_bundles VALUES (?, ?, ?, ?, ?)",
                        [bundle.bundle_id, bundle.version, bundle.effective_at, bundle.cedar,
                         orjson.dumps(types).decode()])
        keep_version(self.db, bundle, types)
        self.store.forget(*POLICY_MEMO)
        names = sorted(set(before) | set(types))
        return [dk.policy(bundle.bundle_id)] + [dk.contract(n) for n in names] + trust_keys

    def apply_revocation(self, revocation: Revocation) -> list[str]:
        """Record a withdrawal; it applies at once, whatever its effective_at (fail closed).

        It withdraws from every principal record made at or before its effective_at, and from
        records up to the delegation version it names (see `revocation_applies`), whichever
        of the principal and the revocation was read first.
        """
        return self.apply_identities([revocation])[0]  # type: ignore[return-value]

    # -- the compiler's read-only view ---------------------------------------------------

    def entity_matches(self, name: str) -> Sequence[str]:
        """Canonical ids whose id equals `name` or which carry it as an alias (case-insensitive)."""
        return self.entity_matches_many([name])[name]

    def entity_matches_many(self, names: Sequence[str]) -> dict[str, list[str]]:
        """`entity_matches` for many names in one statement (none for names the writer remembers)."""
        known = self._ids_by_name("catalog.entity_matches", names, (
            "SELECT n.name, e.id FROM (SELECT unnest(?) AS name) n JOIN entities e ON NOT e.deleted AND "
            "(e.id = n.name OR list_contains(list_transform(e.aliases, lambda a: lower(a)), lower(n.name))) "
            "ORDER BY e.id"))
        return {name: list(ids) for name, ids in known.items()}

    def entities_named(self, names: Sequence[str]) -> dict[str, list[str]]:
        """For each lower-cased name, the ids whose id or alias equals it in any case (one equi-join).

        Names the writer remembers cost nothing: a hot plan's query asks for the same ones each batch.
        """
        known = self._ids_by_name("catalog.entities_named", names, (
            "WITH n AS (SELECT DISTINCT unnest(?) AS name), k AS ("
            "SELECT id, lower(id) AS name FROM entities WHERE NOT deleted UNION "
            "SELECT id, lower(a) FROM (SELECT id, unnest(aliases) AS a FROM entities WHERE NOT deleted)) "
            "SELECT n.name, k.id FROM n JOIN k USING (name) ORDER BY 1, 2"))
        return {name: list(ids) for name, ids in known.items() if ids}

    def _ids_by_name(self, memo_name: str, names: Sequence[str], sql: str) -> dict[str, tuple[str, ...]]:
        """Entity ids per name: remembered ones from the writer's memo, the rest by `sql` (one `?`: the names)."""
        memo = self.store.cached(memo_name, dict)
        missing = sorted({n for n in names if n not in memo})
        found: dict[str, list[str]] = {name: [] for name in missing}
        if missing:
            for name, entity_id in self.db.execute(sql, [missing]).fetchall():
                found[name].append(entity_id)
        known = {name: tuple(found[name]) if name in found else memo[name] for name in names}
        remember(memo, {n: tuple(ids) for n, ids in found.items()})
        return known

    def trusted_sources(self) -> dict[str, frozenset[str]]:
        """Evidence class -> the provenance groups some bundle's source rules allow to assert it."""
        def load() -> dict[str, frozenset[str]]:
            out: dict[str, set[str]] = {}
            for group, classes in self.db.execute("SELECT provenance_group, classes FROM source_rules").fetchall():
                for cls in classes or ():
                    out.setdefault(cls, set()).add(group)
            return {cls: frozenset(groups) for cls, groups in out.items()}
        return dict(self.store.cached("catalog.trusted", load))

    def principal(self, principal_id: str) -> Principal | None:
        """The principal with revoked roles, grants, delegations and sessions taken away."""
        return self.principals_many([principal_id]).get(principal_id)

    def principals_many(self, principal_ids: Sequence[str]) -> dict[str, Principal]:
        """`principal` for many ids in two statements (none for ids the writer remembers); unknown or deleted left out.

        Principals are frozen, so the writer hands the ones it remembers out as they are.
        """
        memo = self.store.cached("catalog.principals", dict)
        missing = sorted({p for p in principal_ids if p not in memo})
        found = self._principals(missing) if missing else {}
        known = {pid: found.get(pid) if pid in missing else memo[pid] for pid in principal_ids}
        remember(memo, {pid: found.get(pid) for pid in missing})
        return {pid: principal for pid, principal in known.items() if principal is not None}

    def _principals(self, ids: list[str]) -> dict[str, Principal]:
        rows = self.db.execute("SELECT id, roles, attributes, delegation_version, made_at FROM principals "
                               "WHERE id IN (SELECT unnest(?)) AND NOT deleted", [ids]).fetchall()
        if not rows:
            return {}
        revoked: dict[str, list[tuple[str, str, int | None, datetime | None]]] = {}
        for pid, kind, value, as_of, effective_at in self.db.execute(
                "SELECT principal, kind, value, delegation_version, effective_at FROM revoked "
                "WHERE principal IN (SELECT unnest(?))", [[r[0] for r in rows]]).fetchall():
            revoked.setdefault(pid, []).append((kind, value, as_of, effective_at))
        out = {}
        for pid, roles, attributes, version, made_at in rows:
            out[pid] = _principal(pid, roles, attributes, version, [
                (k, v) for k, v, as_of, effective_at in revoked.get(pid, ())
                if revocation_applies(made_at, version, effective_at, as_of)])
        return out

    def contract(self, decision_type: str, at: datetime | None = None) -> tuple[Contract, CompiledPolicy] | None:
        """The contract of a decision type and the bundle version governing it at `at` (see `governing`)."""
        return self.contract_in(decision_type, self.versions(decision_type), at)

    def versions(self, decision_type: str) -> list[tuple]:
        """`versions_of` the decision type (remembered by the writer until a policy changes)."""
        memo = self.store.cached("catalog.versions", dict)
        rows = memo.get(decision_type)
        if rows is None:
            rows = versions_of(self.db, decision_type)
            remember(memo, {decision_type: rows})
        return rows

    def contract_in(self, decision_type: str, rows: list[tuple],
                    at: datetime | None) -> tuple[Contract, CompiledPolicy] | None:
        """`contract` over the rows `versions_of` read; the policy carries when the next version takes over."""
        found = governing(rows, at)
        if found is None:
            return None
        key = (found.bundle_id, found.version)
        policy = self._policies.get(key)
        if policy is None:  # first use after a restart: parse once, then reuse
            cedar, sources, trust = self.db.execute(
                "SELECT cedar, sources, source_trust FROM policy_versions WHERE bundle_id = ? AND version = ?",
                list(key)).fetchone()
            rules = {group: tuple(classes) for group, classes in orjson.loads(sources or "{}").items()}
            # Versions kept before the opt-out existed read as the default: trust on.
            policy = compile_policy(PolicyBundle(*key, found.effective_at, cedar, (), rules, trust is not False),
                                    strict=False)
            self._policies[key] = policy
        contract = self._contracts.get(key + (decision_type,))
        if contract is None:
            contract = self._contracts[key + (decision_type,)] = contract_from(decision_type, orjson.loads(found.body))
        if policy.superseded_at != found.superseded_at:
            policy = replace(policy, superseded_at=found.superseded_at)
        return contract, policy

    def decision_types(self) -> Sequence[str]:
        """Every decision type in the current catalogue."""
        return list(self.store.cached("catalog.decision_types", lambda: tuple(
            r[0] for r in self.db.execute("SELECT decision_type FROM contracts ORDER BY 1").fetchall())))

    def candidates(self, entity_id: str, contract: Contract) -> Sequence[Resource]:
        """Resources of the entity whose class is accepted or whose claims touch the contract."""
        return self._candidates("entity = ?", entity_id, contract)

    def candidates_many(self, entity_ids: Sequence[str], contract: Contract) -> dict[str, list[Resource]]:
        """`candidates` for many entities in one statement (recompiling a fan-out)."""
        out: dict[str, list[Resource]] = {e: [] for e in entity_ids}
        for resource in self._candidates("entity IN (SELECT unnest(?))", list(entity_ids), contract):
            out[resource.entity].append(resource)
        return out

    def _candidates(self, entity_filter: str, entities: object, contract: Contract) -> list[Resource]:
        classes = sorted({c for p in contract.propositions for c in p.accepted_classes})
        props = sorted({p.id for p in contract.propositions})
        # Materialising the entity's rows first lets DuckDB use the entity index; with the
        # disjunction in the same WHERE it falls back to a full scan (16 ms at 100k resources).
        rows = self.db.execute(
            f"WITH e AS MATERIALIZED (SELECT * FROM resources WHERE {entity_filter}) "
            f"SELECT {RESOURCE_COLS} FROM e WHERE NOT deleted AND ("
            "list_contains(?, evidence_class) OR list_has_any(supports, ?) OR list_has_any(contradicts, ?)) "
            "ORDER BY id", [entities, classes, props, props]).fetchall()
        return [resource_row(r) for r in rows]


def _principal(pid: str, roles, attributes: str | None, version: int | None,
               revoked: list[tuple[str, str]]) -> Principal:
    gone_roles = {v for k, v in revoked if k == "role"}
    attrs = orjson.loads(attributes or "{}")
    for kind, attr in (("grant", "grants"), ("delegation", "delegations"), ("session", "sessions")):
        gone = {v for k, v in revoked if k == kind}
        if gone and isinstance(attrs.get(attr), list):
            attrs[attr] = [v for v in attrs[attr] if v not in gone]
    attrs["revoked_delegations"] = sorted(v for k, v in revoked if k == "delegation")
    attrs["revoked_sessions"] = sorted(v for k, v in revoked if k == "session")
    return Principal(id=pid, roles=tuple(r for r in roles or () if r not in gone_roles),
                     attributes=attrs, delegation_version=version or 0)


def _contract_doc(contract: Contract) -> dict:
    """A contract back in its wire shape, for storage."""
    def age(p):
        if p.max_age is None:
            return None
        return f"PT{int(p.max_age.total_seconds())}S"
    return {"purposes": list(contract.purposes), "loss": contract.loss, "threshold": contract.threshold,
            "conflict_ceiling": contract.conflict_ceiling,
            "observations": contract.observations, "min_relevance": contract.min_relevance,
            "controller": contract.controller, "ask_scope": contract.ask_scope,
            "propositions": [{"id": p.id, "accepted_classes": list(p.accepted_classes),
                              "required": p.required, "min_independent": p.min_independent,
                              "max_age": age(p), "threshold": p.threshold,
                              "precedence": list(p.precedence)} for p in contract.propositions]}
