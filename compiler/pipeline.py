"""The six passes end to end: a request and a read-only catalog view in, a compiled plan out."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Mapping, Protocol, Sequence

from compiler.admission import Admission, admit
from compiler import dependency_keys as dk
from compiler.attest import content_hash, dependency_keys, digest, next_change
from compiler.edge import tidy_all
from compiler.errors import AdmitError, PlanError, RequestError
from compiler.evsi import decision_model, plan_observations
from compiler.policy import Authorisation, CompiledPolicy, may_ask
from compiler import controller
from compiler.controller import settings_of
from compiler.relevance import query_terms
from compiler.request import DecisionRequest, parse_request, plan_key
from compiler.resolve import out_of_scope, query_names, query_words, resolve_entity, resolve_principal, type_check
from compiler.selection import Selection, select
from compiler.trust import rules_for
from compiler.slots import fill_slots, overall_state, settled_stop, stop_reason
from schemas.records import Contract, Principal, Resource
from schemas.timefmt import format_instant

PLAN_ID_HEX = 20  # hex digits of a plan id after `plan-`: an id of any other shape was never issued


class CatalogView(Protocol):
    """What the compiler may read of the catalog; state/ implements it over DuckDB."""

    def entity_matches(self, name: str) -> Sequence[str]:
        """Canonical ids whose id or alias equals `name`."""

    def principal(self, principal_id: str) -> Principal | None:
        """The principal record, if known."""

    def contract(self, decision_type: str, at: datetime | None = None) -> tuple[Contract, CompiledPolicy] | None:
        """The contract of a decision type and the bundle version that defines it in effect at `at`.

        When no version is in effect yet, the earliest that defines it (the compiler refuses it);
        `at` None: the latest version.
        """

    def decision_types(self) -> Sequence[str]:
        """Every decision type in the current catalogue."""

    def candidates(self, entity_id: str, contract: Contract) -> Sequence[Resource]:
        """Resources of the entity whose class or claims the contract can use."""

    def entities_named(self, names: Sequence[str]) -> Mapping[str, Sequence[str]]:
        """For each lower-cased name, the canonical ids whose id or alias equals it in any case."""

    def trusted_sources(self) -> Mapping[str, frozenset[str]]:
        """Evidence class -> the provenance groups some source rule names as allowed to assert it."""


@dataclass(frozen=True)
class CompiledPlan:
    """A plan, its receipt and what it depends on."""

    plan_key: str
    """Cache key: hash of the request's dimensions."""
    plan_id: str
    """Hash of the key with the outcome; identical recompilations keep it."""
    receipt_id: str
    """Id of the receipt of this compilation."""
    plan: dict[str, Any]
    """Wire shape published on `plans` and served by select."""
    receipt: dict[str, Any]
    """Wire shape published on `receipts` (no denied content)."""
    dependencies: tuple[str, ...]
    """Dependency keys for the index."""
    valid_until: datetime | None
    """For live plans, when the clock next changes the outcome."""
    request: DecisionRequest
    """The parsed request, to recompile from."""


def as_decided_at(compiled: CompiledPlan, decision_time: str, receipt_id: str) -> CompiledPlan | None:
    """This compilation dated `decision_time`, if that makes its receipt the one named `receipt_id`; else None.

    A recompilation with the outcome, horizon and dependency keys of the stored plan differs
    from it only in its decision time, which the receipt digests: equal digests prove the stored
    plan and receipt are this compilation's, so they stay current as they are.
    """
    if compiled.receipt_id == receipt_id:
        return compiled
    receipt = {k: v for k, v in compiled.receipt.items() if k != "receipt_id"}
    if "decision_time" not in receipt:
        return None
    receipt["decision_time"] = decision_time
    if digest(receipt, prefix="rcpt-") != receipt_id:
        return None
    receipt["receipt_id"] = receipt_id
    return replace(compiled, receipt_id=receipt_id, receipt=receipt,
                   plan=dict(compiled.plan, decision_time=decision_time, receipt_id=receipt_id))


class ClockUnknown(RequestError):
    """A live decision was asked for before any clock tick arrived."""

    pass_name = "parse"


@dataclass(frozen=True)
class Resolved:
    """A request after passes 1 to 3 and retrieval: what passes 4 to 6 compile."""

    request: DecisionRequest
    """The parsed request."""
    entity_id: str
    """Its canonical entity id."""
    principal: Principal
    """The principal (a bare one when unknown)."""
    known_principal: bool
    """Whether the principal is in the catalog."""
    contract: Contract
    """The decision type's contract."""
    policy: CompiledPolicy
    """The bundle version in effect at the decision's time."""
    candidates: tuple[Resource, ...]
    """Resources retrieved for the entity (none when the query is out of scope)."""
    when: datetime
    """The instant decided at."""
    trusted: Mapping[str, frozenset[str]]
    """Evidence class -> provenance groups some source rule allows to assert it."""
    scoped_out: bool
    """The query names another entity: the plan abstains."""


def compile_request(doc: Any, view: CatalogView, now: datetime | None) -> CompiledPlan:
    """Run the six passes over a select body."""
    return compile_resolved(resolve_request(doc, view, now))


def resolve_request(doc: Any, view: CatalogView, now: datetime | None) -> Resolved:
    """Passes 1 to 3 and retrieval; raises the RequestError of the first pass that refuses."""
    request = doc if isinstance(doc, DecisionRequest) else parse_request(doc)
    entity_id = resolve_entity(request.entity, view.entity_matches(request.entity))
    principal, known = resolve_principal(request.principal, view.principal(request.principal))
    when = request.decision_time or now
    found = view.contract(request.decision_type, when)  # the version in effect at the decision's time
    contract = type_check(request.decision_type, request.purpose, found and found[0],
                          view.decision_types())
    policy = found[1]
    if when is None:
        raise ClockUnknown("clock_unknown", "The service has not seen a clock tick yet, so a live "
                           "decision has no time; send decision_time or wait for the clock.", status=503)
    names = query_names(request.query)
    # The 003 seed's scope guard: a question about another tenant stops before retrieval, whether
    # the tenant is named in its text or is the request's entity outside the principal's scope.
    scoped_out = (contract.ask_scope and not (known and may_ask(
        policy, principal, entity_id, purpose=request.purpose, decision_type=contract.decision_type,
        decision_time=when))) or (bool(names) and out_of_scope(entity_id, view.entities_named(names)))
    candidates = () if scoped_out else tuple(view.candidates(entity_id, contract))
    return Resolved(request, entity_id, principal, known, contract, policy, candidates, when,
                    view.trusted_sources(), scoped_out)


def compile_resolved(resolved: Resolved, verdict: Authorisation | None = None) -> CompiledPlan:
    """Passes 4 to 6 of a resolved request; `verdict` is Cedar's answer if already asked."""
    r = resolved
    return compile_plan(r.request, r.entity_id, r.principal, r.contract, r.policy, r.candidates, r.when,
                        known_principal=r.known_principal, trusted=r.trusted, scoped_out=r.scoped_out,
                        verdict=verdict)


def check_plan(request: DecisionRequest, policy: CompiledPolicy, when: datetime) -> None:
    """The refusals of passes 4 and 5 that come before any candidate is looked at."""
    if policy.effective_at is not None and when < policy.effective_at:
        asked = "this live decision at the service's now" if request.live else "the decision_time"
        raise AdmitError("policy_not_effective", f"No version of policy bundle {policy.bundle_id} that defines "
                         f"'{request.decision_type}' is in effect at {asked} ({format_instant(when)}); the "
                         f"earliest, v{policy.version}, takes effect at {format_instant(policy.effective_at)}. "
                         "Decide at or after that instant, or publish a version effective earlier.", status=422)
    if request.budget.tokens == 0 or request.budget.calls == 0:
        raise PlanError("empty_budget", "A budget of zero tokens or zero calls cannot carry any evidence; "
                        "raise budget.tokens and budget.calls, or omit them for no limit.", status=422)


def compile_plan(request: DecisionRequest, entity_id: str, principal: Principal, contract: Contract,
                 policy: CompiledPolicy, candidates: Sequence[Resource], when: datetime, *,
                 known_principal: bool = True, trusted: Mapping[str, frozenset[str]] | None = None,
                 scoped_out: bool = False, verdict: Authorisation | None = None) -> CompiledPlan:
    """Passes 4 to 6 over already resolved inputs; an unknown principal may use nothing.

    `trusted` is every bundle's source rules (evidence class -> groups that may assert it); the
    classes the contract treats as authoritative take the governing version's own (`rules_for`); `scoped_out`
    means the query names another entity, and the plan abstains with nothing admitted;
    `verdict` is Cedar's answer for `candidates` when a batch already asked it.
    """
    check_plan(request, policy, when)
    trusted = rules_for(contract, policy.trusted, trusted or {})
    admission = admit(candidates, entity_id=entity_id, principal=principal, contract=contract,
                      policy=policy, purpose=request.purpose, decision_time=when, trusted=trusted,
                      known_principal=known_principal, verdict=verdict) if not scoped_out else Admission((), (), ())
    retrieval = controller.Outcome(stop="out_of_scope") if scoped_out else None
    if retrieval is None:
        retrieval = controller.run(request.query, [r for r, _ in admission.typed], settings_of(contract),
                                   contract.min_relevance)
    usable, unrelated = answerable(admission.typed, retrieval, contract, bool(query_terms(request.query)))
    typed_resources = [r for r, _ in usable]
    relevance = {r.id: s for r, s in retrieval.retrieved}
    model = decision_model(contract)
    report = None
    if model is None:
        chosen = select(usable, relevance, contract, request.budget)
    else:
        evsi_plan = plan_observations(typed_resources, model, request.budget, relevance)
        chosen = Selection(evsi_plan.admitted, evsi_plan.rejected, evsi_plan.spent, False)
        report = evsi_plan.report
    by_id = {r.id: r for r in candidates}
    withheld = [by_id[i] for i in admission.withheld]
    slots = fill_slots(chosen.admitted, contract, {r.id: props for r, props in usable})
    state = overall_state(slots, admission.withheld_typed)
    planner_stop = stop_reason(slots, chosen.budget_hit) if model is None else evsi_plan.stop_reason
    stop = settled_stop(state, NO_RELEVANT_EVIDENCE if unrelated and not usable else planner_stop)
    if scoped_out:
        state, stop = "INSUFFICIENT", "out_of_scope"
    rejected = sorted(admission.rejected + chosen.skipped + tuple((i, NOT_RELEVANT) for i in unrelated))
    spent = {"tokens": int(chosen.spent.tokens), "calls": int(chosen.spent.calls)}
    spent.update({k: v for k, v in chosen.spent.as_dict().items() if k not in spent})
    key = plan_key(request, entity_id)
    deps = dependency_keys(principal_id=principal.id, entity_id=entity_id, entity_name=request.entity,
                           bundle_id=policy.bundle_id, contract=contract, candidates=candidates)
    deps = sorted(set(deps) | _edge_keys(request.query, contract, candidates))
    valid_until = next_change(candidates, contract, when, policy.superseded_at) if request.live else None
    if valid_until is not None:
        deps.append(dk.time(valid_until))
    plan_id = digest({"key": key, "admitted": [(r.id, r.version) for r in chosen.admitted],
                      "policy": [policy.bundle_id, policy.version, policy.digest],
                      "slots": [(s.proposition, s.state) for s in slots], "rejected": rejected,
                      "withheld": len(withheld), "state": state, "stop": stop}, prefix="plan-", length=PLAN_ID_HEX)
    decided_at = format_instant(when)
    receipt = tidy_all({
        "schema_version": 1, "plan_id": plan_id, "request": request.as_dict(),
        "entity_id": entity_id, "decision_time": decided_at,
        "policy": {"bundle_id": policy.bundle_id, "version": policy.version, "hash": policy.digest},
        "admitted": [{"resource_id": r.id, "version": r.version, "content_hash": content_hash(r)}
                     for r in chosen.admitted],
        "rejected": [{"resource_id": i, "reason": why} for i, why in rejected]
        + [{"resource_id": i, "reason": "not_authorised"} for i in admission.withheld],
        "slots": [s.as_dict() for s in slots], "state": state, "stop_reason": stop,
        "budget_spent": spent, "dependencies": deps, "decision": report,
        "policy_errors": admission.policy_errors, "retrieval": trace_of(retrieval),
    })
    receipt_id = digest(receipt, prefix="rcpt-")
    receipt["receipt_id"] = receipt_id
    # Dependency keys name withheld resources, so they live in the receipt, not the plan.
    plan = tidy_all({
        "schema_version": 1, "plan_id": plan_id, "plan_key": key, "state": state,
        "request": request.as_dict(), "entity_id": entity_id, "decision_time": decided_at,
        "policy": {"bundle_id": policy.bundle_id, "version": policy.version},
        "admitted": [{"resource_id": r.id, "version": r.version, "evidence_class": r.evidence_class,
                      "tokens": r.tokens, "content": r.content} for r in chosen.admitted],
        "rejected": [{"resource_id": i, "reason": why} for i, why in rejected],
        "withheld": len(withheld), "slots": [s.as_dict() for s in slots], "stop_reason": stop,
        "budget_spent": spent, "valid_until": valid_until and format_instant(valid_until),
        "receipt_id": receipt_id, "decision": report, "retrieval": trace_of(retrieval),
    })
    return CompiledPlan(key, plan_id, receipt_id, plan, receipt, tuple(deps), valid_until, request)


NOT_RELEVANT = "not_relevant"
NO_RELEVANT_EVIDENCE = "no_relevant_evidence"


def answerable(typed: Sequence[tuple[Resource, frozenset[str]]], retrieval: controller.Outcome,
               contract: Contract, asked: bool) -> tuple[tuple[tuple[Resource, frozenset[str]], ...], tuple[str, ...]]:
    """The typed candidates a question can rest on, and the ids of those it cannot (not relevant).

    With no question there is nothing to be relevant to. Otherwise support needs the controller
    to have found relevant evidence; a catalogue `min_relevance` or a controller then also keeps
    each item to what was retrieved above it, while the plain default only asks that the plan
    has one relevant item (a typed record such as a workflow event speaks to its proposition
    whatever the question's words).
    """
    if not asked:
        return tuple(typed), ()
    if not retrieval.sufficient:
        return (), tuple(sorted(r.id for r, _ in typed))
    if contract.min_relevance is None and contract.controller is None:
        return tuple(typed), ()
    keep = {r.id for r in retrieval.relevant}
    return (tuple(it for it in typed if it[0].id in keep),
            tuple(sorted(r.id for r, _ in typed if r.id not in keep)))


def trace_of(retrieval: controller.Outcome) -> dict:
    """The controller's trace as plans and receipts carry it: only ever authorised candidates' ids."""
    return {"stop": retrieval.stop, "retrievals": retrieval.retrievals, "scored": retrieval.scored,
            "trace": retrieval.trace}


def _edge_keys(query: str, contract: Contract, candidates: Sequence[Resource]) -> set[str]:
    """Keys of what else the outcome reads: names in the query, and who may assert each class.

    `name-word:<w>` per word of the query is coarse on purpose: an entity change announces
    every word of the names it adds or drops, and any name found whole in the query shares
    its words with it, so a new tenant named in a stored query always reaches the plan (an
    unrelated name sharing one word only recompiles it). `trust:<class>` follows the source
    rules of the classes the plan can meet.
    """
    keys = {dk.name_word(w) for w in query_words(query)}
    classes = {c for p in contract.propositions for c in p.accepted_classes} | {r.evidence_class for r in candidates}
    keys.update(dk.trust(c) for c in classes)
    return keys
