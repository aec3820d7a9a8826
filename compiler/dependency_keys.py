"""Dependency keys: how each kind is written, read back, and the invalidation reason it stands for."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from schemas.timefmt import format_instant, parse_instant

RESOURCE = "resource"
SCOPE = "scope"
PRINCIPAL = "principal"
POLICY = "policy"
CONTRACT = "contract"
TIME = "time"
ENTITY = "entity"
ALIAS = "alias"
NAME_WORD = "name-word"
TRUST = "trust"

REASONS = {RESOURCE: "source_changed", SCOPE: "scope_changed", PRINCIPAL: "principal_changed",
           POLICY: "policy_changed", CONTRACT: "contract_changed", TIME: "time_passed",
           ENTITY: "source_changed", ALIAS: "source_changed", NAME_WORD: "source_changed",
           TRUST: "source_changed", "retention": "evicted", "plan": "stale_on_arrival", "replay": "state_rebuilt"}
"""Kind -> the `reason` of a plan-invalidations record it causes."""
DEFAULT_REASON = "source_changed"
"""The reason of a key of no known kind: some input changed."""

WITHHELD = "resource:withheld"
"""The public cause's key when the real one names a resource the plan's principal may not discover."""
EVICTION = "retention:plan"
"""The cause's key of an eviction: no input changed, the plan went unused."""
REPLAY = "replay"
"""The cause's key of plans announced because the state was rebuilt from the topics."""


@dataclass(frozen=True)
class DependencyKey:
    """A key read back: its kind and what it names."""

    kind: str
    """The text before the first colon (the whole key when it has none)."""
    value: str
    """The text after the first colon ("" when it has none)."""

    @property
    def reason(self) -> str:
        """The invalidation reason this key's kind stands for."""
        return REASONS.get(self.kind, DEFAULT_REASON)


def parse(key: str) -> DependencyKey:
    """Split a key into kind and value; never raises (unknown kinds parse too)."""
    kind, _, value = key.partition(":")
    return DependencyKey(kind, value)


def reason(key: str) -> str:
    """The invalidation reason of a plan touched through `key`."""
    return REASONS.get(key.partition(":")[0], DEFAULT_REASON)


def resource(resource_id: str) -> str:
    """A resource changed (upsert, delete) or is used, rejected or withheld by a plan."""
    return f"{RESOURCE}:{resource_id}"


def resource_id(key: str) -> str | None:
    """The resource a `resource:` key names, else None."""
    kind, _, value = key.partition(":")
    return value if kind == RESOURCE else None


def scope_class(entity_id: str, evidence_class: str) -> str:
    """Resources of this class for this entity: a plan missing such evidence depends on it."""
    return f"{SCOPE}:{entity_id}/{evidence_class}"


def scope_claim(entity_id: str, proposition: str) -> str:
    """Resources claiming this proposition about this entity."""
    return f"{SCOPE}:{entity_id}/claims:{proposition}"


def scope_keys(entity_id: str, evidence_class: str, claims: Iterable[str]) -> list[str]:
    """Keys under which a resource's existence matters: its class and the propositions it claims."""
    return [scope_class(entity_id, evidence_class)] + [scope_claim(entity_id, p) for p in claims]


def principal(principal_id: str) -> str:
    """A principal's record or revocations."""
    return f"{PRINCIPAL}:{principal_id}"


def policy(bundle_id: str) -> str:
    """A policy bundle's Cedar text or version."""
    return f"{POLICY}:{bundle_id}"


def contract(decision_type: str) -> str:
    """A decision type's contract."""
    return f"{CONTRACT}:{decision_type}"


def time(instant: datetime | str) -> str:
    """The instant a live plan's outcome changes; a string is an instant already formatted."""
    return f"{TIME}:{instant if isinstance(instant, str) else format_instant(instant)}"


def time_of(key: str) -> datetime | None:
    """The instant of a `time:` key, else None; ValueError when its instant does not parse."""
    kind, _, value = key.partition(":")
    return parse_instant(value) if kind == TIME else None


def entity(entity_id: str) -> str:
    """An entity's record."""
    return f"{ENTITY}:{entity_id}"


def alias(name: str) -> str:
    """A name (lower-cased) some entity is or was known by."""
    return f"{ALIAS}:{name.lower()}"


def name_word(word: str) -> str:
    """A word of a query, or of a name an entity change adds or drops (coarse on purpose)."""
    return f"{NAME_WORD}:{word}"


def trust(evidence_class: str) -> str:
    """The source rules naming who may assert an evidence class."""
    return f"{TRUST}:{evidence_class}"


def plan(plan_id: str) -> str:
    """The cause's key of a plan found stale on arrival from a peer."""
    return f"plan:{plan_id}"
