"""Cedar policy bundles parsed once into handles, and batch authorisation of candidates."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

import cedarpy
import orjson
from cedarpy import pst

from compiler.errors import PolicyError
from compiler.trust import bundle_trust
from schemas.records import PolicyBundle, Principal, Resource
from schemas.timefmt import epoch_seconds

_LONG = (-(2**63), 2**63 - 1)
_DECIMAL_STEP = Decimal("0.0001")  # Cedar decimals carry four fractional digits
_DECIMAL_MAX = Decimal("922337203685477.5807")
_ORDERING = {"less": "lessThan", "less_eq": "lessThanOrEqual", "greater": "greaterThan",
             "greater_eq": "greaterThanOrEqual"}
_DECIMAL_METHODS = {"decimal_less_than", "decimal_less_eq", "decimal_greater", "decimal_greater_eq"}
_ESCAPES = {"__entity", "__extn", "__expr"}  # keys Cedar's JSON reads as entity or extension values


@dataclass(frozen=True)
class CompiledPolicy:
    """A parsed policy bundle: reuse it for every request of this version."""

    bundle_id: str
    """Bundle id."""
    version: int
    """Bundle version."""
    digest: str
    """sha256 of the Cedar text, for receipts."""
    effective_at: datetime | None
    """Decisions before this instant cannot be governed by this version."""
    policy_set: Any
    """The cedarpy PolicySet handle."""
    superseded_at: datetime | None = None
    """When a later version of the bundle takes over from this one (None: none is known)."""
    self_contained: bool = False
    """No condition names a User or Resource entity, so other entities in a store cannot change a decision."""
    trusted: Mapping[str, frozenset[str]] | None = field(default=None, compare=False)
    """Evidence class -> the groups this version's `sources` name for it; None: the bundle opted out of trust."""


@dataclass(frozen=True)
class Authorisation:
    """Cedar's answer for a batch of candidates."""

    allowed: tuple[bool, ...]
    """Per candidate, in order: True only for a clean Allow (any evaluation error denies)."""
    errors: tuple[bool, ...]
    """Per candidate: whether some policy failed to evaluate for it (or it could not be expressed)."""


class Unrepresentable(ValueError):
    """An attribute value Cedar cannot hold faithfully; the candidate carrying it is denied."""


def compile_policy(bundle: PolicyBundle, strict: bool = True) -> CompiledPolicy:
    """Parse a bundle's Cedar text; raise PolicyError when it does not parse or cannot evaluate.

    `strict` adds the static checks (comparisons that always fail); a bundle stored before
    those checks existed is loaded without them and still fails closed when it errors.
    """
    try:
        handle = cedarpy.PolicySet.from_str(bundle.cedar)
    except ValueError as exc:
        raise PolicyError(f"Cedar bundle {bundle.bundle_id} v{bundle.version} does not parse: {exc}") from None
    if strict:
        problem = static_problem(bundle.cedar)
        if problem:
            error = PolicyError(f"Cedar bundle {bundle.bundle_id} v{bundle.version} cannot evaluate: {problem}")
            error.detail = problem  # names the construct, never quotes the policy text
            raise error
    digest = hashlib.sha256(bundle.cedar.encode()).hexdigest()
    return CompiledPolicy(bundle.bundle_id, bundle.version, digest, bundle.effective_at, handle,
                          self_contained=self_contained(bundle.cedar), trusted=bundle_trust(bundle))


def self_contained(text: str) -> bool:
    """Whether the bundle's decisions read only the request's own principal and resource.

    A condition naming an entity literal (`User::"boss".roles`) errors when that entity is
    absent from the store and reads it when present, so only bundles without one may share a
    store of many requests' entities. Templates, and syntax newer than cedarpy's tree, count
    as not self-contained.
    """
    try:
        tree = cedarpy.policies_to_pst(text)
    except ValueError:
        return False
    if tree.templates or tree.template_links:
        return False
    stack: list[Any] = [c for p in tree.static_policies.values() for c in p.clauses]
    while stack:
        node = stack.pop()
        if isinstance(node, pst.EntityLit) and (node.value.type.basename != "Action" or node.value.type.namespace):
            return False
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, tuple):
            stack.extend(node)
        elif is_dataclass(node) and not isinstance(node, type):
            stack.extend(getattr(node, f.name) for f in fields(node))
    return True


def static_problem(text: str) -> str | None:
    """The first expression of a parsed bundle that errors whatever the data, or None.

    Numbers with a fraction reach Cedar as `decimal` values, which `<`, `<=`, `>` and `>=` do
    not order; a bundle must compare them with `.lessThan(decimal("8.0"))` and the like.
    """
    try:
        tree = cedarpy.policies_to_pst(text)
    except ValueError:
        return None  # syntax newer than cedarpy's tree: evaluation errors still deny
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, pst.BinaryOp):
            sides = (node.left, node.right)
            if node.op in _ORDERING and any(_is_decimal_literal(s) for s in sides):
                return (f"`{_ORDERING[node.op]}` is needed to compare a decimal; the operator form "
                        "orders only integers, datetimes and durations")
            if node.op in _DECIMAL_METHODS and any(isinstance(s, pst.LongLit) for s in sides):
                return "a decimal comparison against an integer literal; write decimal(\"8.0\") instead of 8"
        if isinstance(node, pst.UnaryOp) and node.op == "decimal" and isinstance(node.arg, pst.StringLit):
            if not _valid_decimal_literal(node.arg.value):
                return "a decimal literal with more than four fractional digits or out of range"
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, tuple):
            stack.extend(node)
        elif is_dataclass(node) and not isinstance(node, type):
            stack.extend(getattr(node, f.name) for f in fields(node))
    return None


def _is_decimal_literal(node: Any) -> bool:
    return isinstance(node, pst.UnaryOp) and node.op == "decimal"


def _valid_decimal_literal(text: str) -> bool:
    whole, dot, fraction = text.partition(".")
    try:
        return bool(dot) and 1 <= len(fraction) <= 4 and abs(Decimal(text)) <= _DECIMAL_MAX and (
            whole.lstrip("-").isdigit() and fraction.isdigit())
    except InvalidOperation:
        return False


def cedar_value(value: Any) -> Any:
    """A JSON value as Cedar JSON: integers are Longs, other numbers decimals, lists sets.

    Nulls are left out (a policy reading one errors, and errors deny); anything Cedar cannot
    hold faithfully raises Unrepresentable.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not _LONG[0] <= value <= _LONG[1]:
            raise Unrepresentable("an integer outside Cedar's 64-bit Long")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unrepresentable("a number that is not finite")
        exact = Decimal(repr(value))
        if abs(exact) > _DECIMAL_MAX:
            raise Unrepresentable("a number outside Cedar's decimal range")
        # Cedar keeps four fractional digits; finer digits round half to even.
        rounded = exact.quantize(_DECIMAL_STEP, rounding=ROUND_HALF_EVEN)
        return {"__extn": {"fn": "decimal", "arg": format(rounded, "f")}}
    if isinstance(value, (list, tuple)):
        return [cedar_value(v) for v in value if v is not None]
    if isinstance(value, dict) or hasattr(value, "items"):
        if _ESCAPES & set(value):
            raise Unrepresentable("a record using Cedar's reserved escape keys")
        return {k: cedar_value(v) for k, v in value.items() if v is not None}
    raise Unrepresentable(f"a value of type {type(value).__name__}")


def principal_entity(principal: Principal) -> dict:
    """The Cedar entity of a principal: its attributes plus `roles` as a set."""
    attrs = cedar_value(dict(principal.attributes))
    attrs["roles"] = list(principal.roles)
    attrs["delegation_version"] = cedar_value(principal.delegation_version)
    return {"uid": {"type": "User", "id": principal.id}, "attrs": attrs, "parents": []}


def resource_entity(resource: Resource) -> dict:
    """The Cedar entity of a resource: its attributes plus entity, evidence class, sensitivity."""
    attrs = cedar_value(dict(resource.attributes))
    attrs.update(entity=resource.entity, evidence_class=resource.evidence_class,
                 sensitivity=resource.sensitivity)
    return {"uid": {"type": "Resource", "id": resource.id}, "attrs": attrs, "parents": []}


def authorise(policy: CompiledPolicy, principal: Principal, resources: Sequence[Resource], *,
              purpose: str, decision_type: str, decision_time: datetime) -> Authorisation:
    """Cedar's decision for `use` of each resource, in one batch.

    Fail closed: a candidate is allowed only on a clean Allow. Cedar skips a policy that errors
    (so a forbid that errors would let a permit win); here any error denies the candidate.
    """
    if not resources:
        return Authorisation((), ())
    user, docs, usable = entity_documents(principal, resources)
    if user is None:
        return denied(len(resources))
    context = request_context(purpose, decision_type, decision_time)
    requests = [use_request(user, resources[i].id, context) for i in usable]
    try:
        results = cedarpy.is_authorized_batch(requests, policy.policy_set, [user, *docs]) if requests else []
    except Exception:  # noqa: BLE001 - whatever the engine raises, nothing is admitted
        return denied(len(resources))
    return verdicts(len(resources), usable, results)


ASK = "ask"


def may_ask(policy: CompiledPolicy, principal: Principal, entity_id: str, *, purpose: str, decision_type: str,
            decision_time: datetime) -> bool:
    """Whether Cedar lets the principal ask about the entity at all (`Action::"ask"` on `Entity::"<id>"`).

    The bundle states the principal's scope (say, the tenants its attributes name); the entity
    carries its id as an attribute so a policy can compare it. Errors and no decision deny.
    """
    try:
        user = principal_entity(principal)
    except Unrepresentable:
        return False
    entity = {"uid": {"type": "Entity", "id": entity_id}, "attrs": {"id": entity_id}, "parents": []}
    request = {"principal": user["uid"], "action": {"type": "Action", "id": ASK},
               "resource": {"type": "Entity", "id": entity_id},
               "context": request_context(purpose, decision_type, decision_time)}
    try:
        [result] = cedarpy.is_authorized_batch([request], policy.policy_set, [user, entity])
    except Exception:  # noqa: BLE001 - whatever the engine raises, the question is out of scope
        return False
    return result.decision == cedarpy.Decision.Allow and not result.diagnostics.errors


def entity_documents(principal: Principal, resources: Sequence[Resource]) -> tuple[dict | None, list[dict], list[int]]:
    """The principal's Cedar entity (None if unrepresentable), the resources' that are, and their indexes."""
    try:
        user = principal_entity(principal)
    except Unrepresentable:
        return None, [], []
    docs, usable = [], []
    for i, r in enumerate(resources):
        try:
            docs.append(resource_entity(r))
            usable.append(i)
        except Unrepresentable:
            pass
    return user, docs, usable


def request_context(purpose: str, decision_type: str, decision_time: datetime) -> dict:
    """The Cedar context every candidate of one request shares."""
    return {"purpose": purpose, "decision_type": decision_type, "decision_time": epoch_seconds(decision_time)}


def use_request(user: dict, resource_id: str, context: Any) -> dict:
    """The Cedar request for `use` of one resource."""
    return {"principal": user["uid"], "action": {"type": "Action", "id": "use"},
            "resource": {"type": "Resource", "id": resource_id}, "context": context}


def denied(count: int) -> Authorisation:
    """Every candidate denied as an error: the engine or the principal could not be asked."""
    return Authorisation((False,) * count, (True,) * count)


def verdicts(count: int, usable: Sequence[int], results: Sequence[Any]) -> Authorisation:
    """Cedar's results for the usable candidates; the others are denied as errors."""
    allowed, errors = [False] * count, [True] * count
    for i, result in zip(usable, results, strict=True):
        decision = result.decision  # a property that looks the enum up on every read
        errors[i] = bool(result.diagnostics.errors) or decision == cedarpy.Decision.NoDecision
        allowed[i] = decision == cedarpy.Decision.Allow and not errors[i]
    return Authorisation(tuple(allowed), tuple(errors))


def principal_representable(attributes: dict) -> bool:
    """Whether Cedar accepts a principal with these attributes (its JSON parser also limits nesting depth).

    A principal it cannot hold is denied everything, so a change into or out of that state
    matters to every plan of the principal, whatever the policies read. The answer depends on
    the attributes alone, so it is remembered by their canonical JSON: a principal's change asks
    of its old attributes what its previous change asked of its new ones (a Cedar call each, 55 us).
    Flat attributes of the plainest kinds need no call at all (`_plain`).
    """
    if _plain(attributes):
        return True
    try:
        canonical = orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (an integer past 64 bits): ask Cedar, unremembered
        return _representable(attributes)
    return _representable_json(canonical)


def _plain(attributes: dict) -> bool:
    """Whether every attribute is a string, a boolean, a Long, a null or a set of strings: kinds Cedar's JSON
    holds as they are, at one level (no nesting to limit, no decimal to convert, no reserved key).

    Every principal update asks about its new attributes, which are mostly of these kinds and new each time
    (so the memo misses): answering them here takes a microsecond where Cedar takes 55. Anything else is
    asked of Cedar (`tests/compiler/test_policy.py` holds this answer to Cedar's on generated attributes).
    """
    for key, value in attributes.items():
        if type(key) is not str or key in _ESCAPES or not _text(key):
            return False
        kind = type(value)
        if kind is bool or value is None or (kind is str and _text(value)):
            continue
        if kind is int:
            if not _LONG[0] <= value <= _LONG[1]:
                return False
            continue
        if kind is list and all(type(item) is str and _text(item) for item in value):
            continue
        return False
    return True


def _text(value: str) -> bool:
    """Whether a string is UTF-8 text (Cedar refuses a lone surrogate, which orjson never decodes but a
    Python string can hold)."""
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _representable_json(canonical: bytes) -> bool:
    return _representable(orjson.loads(canonical))


def _representable(attributes: dict) -> bool:
    try:
        user = principal_entity(Principal("p", attributes=attributes))
    except Unrepresentable:
        return False
    resource = {"uid": {"type": "Resource", "id": "r"}, "attrs": {}, "parents": []}
    try:
        [result] = cedarpy.is_authorized_batch([use_request(user, "r", {})], _permit_all(), [user, resource])
    except Exception:  # noqa: BLE001 - whatever the engine refuses, it cannot hold
        return False
    return result.decision == cedarpy.Decision.Allow and not result.diagnostics.errors


@functools.cache
def _permit_all() -> object:
    """A policy set that permits everything: any error comes from the entity itself."""
    return cedarpy.PolicySet.from_str("permit(principal, action, resource);")
