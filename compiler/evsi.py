"""Budgeted selection by expected value of sample information, net of a visible cost penalty."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from compiler.costs import Cost, cost_of, fits, penalty
from compiler.request import Budget
from compiler.slots import group_of
from schemas.records import Contract, Resource

NOT_WORTH_IT = "not_worth_it"
BUDGET_EXCEEDED = "budget_exceeded"


class ModelError(ValueError):
    """A contract's loss table or observation model is unusable; say which part."""


@dataclass(frozen=True)
class ObservationModel:
    """What a source of one evidence class reports, given each world state."""

    likelihoods: Mapping[str, Mapping[str, float]]
    """world -> outcome -> probability."""
    establishes: bool
    """Whether its outcome may unlock gated actions (an authoritative record)."""

    @property
    def outcomes(self) -> tuple[str, ...]:
        """Every outcome it can report, sorted."""
        return tuple(sorted({o for row in self.likelihoods.values() for o in row}))


@dataclass(frozen=True)
class DecisionModel:
    """Prior, loss table, gated actions and penalty weights of one decision type."""

    prior: Mapping[str, float]
    """world -> prior probability (normalised)."""
    loss: Mapping[str, Mapping[str, float]]
    """action -> world -> loss."""
    requires: Mapping[str, str]
    """action -> the outcome an establishing source must have reported before it is available."""
    weights: Mapping[str, float]
    """Penalty per unit of each cost dimension."""
    observations: Mapping[str, ObservationModel]
    """evidence class -> observation model."""
    escalate_above: float | None = None
    """Escalate when the best action still has more expected loss than this."""


@dataclass(frozen=True)
class EvsiPlan:
    """The observations chosen, how each candidate scored, and where the decision ended."""

    admitted: tuple[Resource, ...]
    rejected: tuple[tuple[str, str], ...]
    spent: Cost
    stop_reason: str
    report: dict[str, Any] = field(default_factory=dict)


def decision_model(contract: Contract) -> DecisionModel | None:
    """The contract's EVSI model, or None when it carries no loss table."""
    if not contract.loss:
        return None
    try:
        loss = contract.loss
        prior = {w: float(p) for w, p in loss["prior"].items()}
        total = sum(prior.values())
        if total <= 0:
            raise ModelError("prior must have positive mass")
        actions = {a: {w: float(v) for w, v in row.items()} for a, row in loss["actions"].items()}
        for action, row in actions.items():
            if set(row) != set(prior):
                raise ModelError(f"loss row of '{action}' must name every world of the prior")
        observations = {
            cls: ObservationModel({w: {o: float(p) for o, p in row.items()} for w, row in m["likelihoods"].items()},
                                  bool(m.get("establishes", False)))
            for cls, m in (contract.observations or {}).items()}
        return DecisionModel({w: p / total for w, p in prior.items()}, actions, dict(loss.get("requires") or {}),
                             {k: float(v) for k, v in (loss.get("penalty") or {}).items()}, observations,
                             loss.get("escalate_above"))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ModelError(f"decision model of {contract.decision_type} is malformed: {exc}") from None


def bayes_risk(belief: Mapping[str, float], established: str | None, model: DecisionModel) -> tuple[str, float]:
    """The best available action and its expected loss; gated actions wait for an establishing record."""
    scored = [(sum(belief[w] * row[w] for w in belief), action) for action, row in model.loss.items()
              if model.requires.get(action) in (None, established)]
    risk, action = min(scored)
    return action, risk


def posterior(belief: Mapping[str, float], obs: ObservationModel, outcome: str) -> dict[str, float]:
    """Bayes' rule for one observed outcome."""
    weighted = {w: p * obs.likelihoods.get(w, {}).get(outcome, 0.0) for w, p in belief.items()}
    total = sum(weighted.values())
    return {w: v / total for w, v in weighted.items()} if total > 0 else dict(belief)


def evsi(belief: Mapping[str, float], established: str | None, obs: ObservationModel,
         model: DecisionModel) -> float:
    """Expected reduction in Bayes risk from observing `obs` before paying for it."""
    _, now = bayes_risk(belief, established, model)
    after = 0.0
    for outcome in obs.outcomes:
        p = sum(belief[w] * obs.likelihoods.get(w, {}).get(outcome, 0.0) for w in belief)
        if p > 0:
            _, risk = bayes_risk(posterior(belief, obs, outcome), outcome if obs.establishes else established,
                                 model)
            after += p * risk
    return now - after


def plan_observations(candidates: Sequence[Resource], model: DecisionModel, budget: Budget,
                      relevance: Mapping[str, float]) -> EvsiPlan:
    """Observe the best positive-net candidate, update belief, repeat; stop when none is worth it."""
    belief, established = dict(model.prior), None
    initial_action, initial_loss = bayes_risk(belief, established, model)
    remaining = [r for r in candidates if r.evidence_class in model.observations]
    admitted: list[Resource] = []
    spent = Cost()
    rounds: list[list[dict]] = []
    observed: list[dict] = []
    seen: set[str] = set()
    while True:
        rows, over = [], []
        for r in remaining:
            cost = cost_of(r)
            if not fits(spent, cost, budget):
                over.append(r)
                continue
            # A copy of a source already observed is not independent evidence (004 seed): it adds nothing.
            value = 0.0 if group_of(r) in seen else evsi(belief, established, model.observations[r.evidence_class],
                                                         model)
            charge = penalty(cost, model.weights)
            rows.append({"resource_id": r.id, "evsi": value, "penalty": charge,
                         "net": value - charge, "_r": r})
        rows.sort(key=lambda x: (-x["net"], -relevance.get(x["resource_id"], 0.0), x["resource_id"]))
        rounds.append([{k: v for k, v in x.items() if k != "_r"} for x in rows])
        if not rows or rows[0]["net"] <= 0:
            break
        chosen: Resource = rows[0]["_r"]
        obs = model.observations[chosen.evidence_class]
        outcome = chosen.attributes.get("outcome")
        if outcome in obs.outcomes:
            belief = posterior(belief, obs, outcome)
            if obs.establishes:
                established = outcome
        observed.append({"resource_id": chosen.id, "outcome": outcome if outcome in obs.outcomes else None})
        admitted.append(chosen)
        seen.add(group_of(chosen))
        spent = spent + cost_of(chosen)
        remaining.remove(chosen)
    action, risk = bayes_risk(belief, established, model)
    worth_less = {x["resource_id"] for x in rows}
    rejected = [(r.id, NOT_WORTH_IT if r.id in worth_less else BUDGET_EXCEEDED) for r in remaining]
    # Out of budget only if something that does not fit would still have been worth observing.
    held_back = max((evsi(belief, established, model.observations[r.evidence_class], model)
                     - penalty(cost_of(r), model.weights) for r in over), default=0.0)
    if model.escalate_above is not None and risk > model.escalate_above:
        stop = "escalate"
    elif held_back > 0:
        stop = "budget_exhausted"
    else:
        stop = "no_positive_value"
    report = {"initial": {"action": initial_action, "expected_loss": initial_loss},
              "final": {"action": action, "expected_loss": risk,
                        "belief": dict(belief), "established": established},
              "observed": observed, "rounds": rounds}
    return EvsiPlan(tuple(admitted), tuple(sorted(rejected)), spent, stop, report)
