"""Immutable records for what travels on the input topics and what the compiler reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Mapping

from schemas.quick_init import quick_init

EMPTY: Mapping[str, Any] = MappingProxyType({})


LOG_TICK_BITS = 22
"""Low bits of a log-ordered version left for the changes of one row within one tick (see `Resource.log_ordered`)."""


@quick_init
@dataclass(frozen=True, slots=True)
class Resource:
    """A versioned source record that may become evidence."""

    id: str
    """Stable resource id (the `source-changes` key)."""
    version: int
    """Monotonic source version; older or equal versions are ignored."""
    entity: str
    """Canonical id of the entity the resource is about."""
    evidence_class: str
    """What kind of evidence the source is allowed to assert (e.g. `approved_waiver`)."""
    tokens: int
    """Token cost of putting the content into a context window."""
    title: str = ""
    """Short human title."""
    content: str = ""
    """The text handed to the model when admitted."""
    supports: tuple[str, ...] = ()
    """Propositions this resource supports."""
    contradicts: tuple[str, ...] = ()
    """Propositions this resource contradicts."""
    valid_from: datetime | None = None
    """Start of validity (inclusive); None means always."""
    valid_to: datetime | None = None
    """End of validity (inclusive); None means open-ended."""
    superseded_by: str | None = None
    """Id of the resource that replaces this one, if any."""
    provenance_group: str | None = None
    """Copies from one group count as one independent source."""
    sensitivity: str = "internal"
    """Sensitivity label, visible to Cedar."""
    attributes: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    """Free attributes visible to Cedar (e.g. `allowed_roles`)."""
    observed_at: datetime | None = None
    """When the fact was last confirmed: what a proposition's `max_age` counts from (None: `valid_from`)."""
    log_ordered: bool = False
    """The version is a source log's tick (`LOG_TICK_BITS`): a change at the stored tick is a later one, read in log
    order, and is stored one version above the stored one (MySQL without a version column)."""
    log_position: str | None = None
    """Where a log-ordered change is in the source log, `<binlog file>:<position>` (a snapshot row: its snapshot's)."""
    log_snapshot: bool = False
    """A log-ordered snapshot read: the row as of `log_position`, though its tick is when its table's read began."""


@dataclass(frozen=True, slots=True)
class Principal:
    """A user or service on whose behalf a decision is compiled."""

    id: str
    """Principal id (the `revocations` key)."""
    roles: tuple[str, ...] = ()
    """Roles currently held (revocations remove them)."""
    attributes: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    """Further attributes visible to Cedar."""
    delegation_version: int = 0
    """Bumped by the identity system whenever delegations change."""


@dataclass(frozen=True, slots=True)
class Entity:
    """A business entity with the names people use for it."""

    id: str
    """Canonical entity id."""
    aliases: tuple[str, ...] = ()
    """Other names that resolve to this entity."""


@dataclass(frozen=True, slots=True)
class Proposition:
    """One required or optional claim of an evidence contract."""

    id: str
    """Proposition name, e.g. `waiver_valid`."""
    accepted_classes: tuple[str, ...]
    """Evidence classes that may establish it."""
    required: bool = True
    """Whether a gap blocks the decision."""
    min_independent: int = 1
    """Independent provenance groups needed."""
    max_age: timedelta | None = None
    """Evidence older than this at decision time is stale."""
    threshold: float | None = None
    """Noisy-or support needed to call it supported; None means the contract's."""
    precedence: tuple[str, ...] = ()
    """Evidence classes, strongest first: when admitted sources disagree, the stronger class decides."""


@dataclass(frozen=True, slots=True)
class Contract:
    """The evidence contract of one decision type."""

    decision_type: str
    """Name, e.g. `credit.review.continuation`."""
    purposes: tuple[str, ...]
    """Purposes under which the decision may be taken."""
    propositions: tuple[Proposition, ...]
    """Slots the plan must fill."""
    threshold: float = 0.8
    """Default noisy-or support a proposition needs."""
    conflict_ceiling: float = 0.5
    """Support and refutation both above this is a conflict, not an average."""
    loss: Any = None
    """Optional loss table for EVSI selection."""
    observations: Any = None
    """Optional observation likelihoods for EVSI selection."""
    min_relevance: float | None = None
    """BM25 a resource needs against the query to count as support (None: the plan needs one relevant item)."""
    controller: Any = None
    """The adaptive retrieval controller's routes, rewrite rules and budgets (None: one retrieval)."""
    ask_scope: bool = False
    """Ask Cedar (`Action::"ask"` on the entity) whether the principal may ask about the entity at all."""


@dataclass(frozen=True, slots=True)
class PolicyBundle:
    """A Cedar policy set and the decision catalogue it governs."""

    bundle_id: str
    """Bundle id (the `policy-versions` key)."""
    version: int
    """Monotonic bundle version."""
    effective_at: datetime
    """When the bundle takes effect."""
    cedar: str
    """Cedar policy text."""
    contracts: tuple[Contract, ...]
    """Decision types this bundle defines."""
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: EMPTY)
    """Provenance group -> the evidence classes that source may assert (unlisted groups: any)."""
    source_trust: bool = True
    """Admit only named groups for the classes its contracts treat as authoritative (False: opted out)."""


@dataclass(frozen=True, slots=True)
class Revocation:
    """Withdrawal of a role, grant, delegation or session."""

    principal: str
    """Principal affected."""
    revoke: str
    """One of role, grant, delegation, session."""
    value: str
    """The role, grant, delegation or session id withdrawn."""
    effective_at: datetime
    """When the withdrawal takes effect (applied at once: fail closed)."""
    issued_by: str = ""
    """Who issued it, for audit."""
    delegation_version: int | None = None
    """The principal's delegation version it applies as of (None: the version stored when applied)."""


@dataclass(frozen=True, slots=True)
class ClockTick:
    """An event-time tick; the service's now only moves forward."""

    now: datetime
    """The instant the tick announces."""


@quick_init
@dataclass(frozen=True, slots=True)
class SourceChange:
    """An upsert or delete on `source-changes`."""

    kind: str
    """resource, principal or entity."""
    op: str
    """upsert or delete."""
    record_id: str
    """Id of the record changed."""
    record: Resource | Principal | Entity | None
    """The new record on upsert; None on delete."""
    unavailable: tuple[tuple[str, str], ...] = ()
    """(field, source column) pairs the source did not send (unchanged TOASTed values): keep the stored ones."""


Payload = SourceChange | PolicyBundle | Revocation | ClockTick


@quick_init
@dataclass(frozen=True, slots=True)
class InputEvent:
    """A decoded, validated event with where it came from."""

    event_id: str
    """Unique id used for idempotence."""
    occurred_at: datetime
    """Event time."""
    topic: str
    """Logical topic name (without prefix)."""
    payload: Payload
    """The typed payload."""
    content_hash: str = ""
    """Digest of the event without `occurred_at`: tells a repeat of an id from a conflicting reuse."""
