"""Many requests compiled together: Cedar asked once per policy set for all their candidates."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

from compiler.cedar_batch import Ask, SharedEntities, authorise_many
from compiler.errors import RequestError
from compiler.pipeline import CatalogView, CompiledPlan, Resolved, check_plan, compile_resolved, resolve_request


def compile_many(docs: Sequence[Any], view: CatalogView, now: datetime | None,
                 shared: SharedEntities | None = None) -> list[CompiledPlan | RequestError]:
    """Per request, in order, the plan `compile_request(doc, view, now)` returns or the RequestError it raises.

    Other exceptions propagate, as they would from `compile_request`. `shared` keeps Cedar
    entities across the calls that compile one batch against one unchanged `view`.
    """
    staged: list[Resolved | RequestError] = []
    for doc in docs:
        try:
            resolved = resolve_request(doc, view, now)
            check_plan(resolved.request, resolved.policy, resolved.when)
        except RequestError as exc:
            staged.append(exc)
            continue
        staged.append(resolved)
    # Only a known principal's in-scope candidates are put to Cedar (as `admit` does).
    asking = [(i, r) for i, r in enumerate(staged)
              if isinstance(r, Resolved) and r.known_principal and not r.scoped_out]
    answers = authorise_many([_ask(r) for _, r in asking], shared)
    verdicts = {i: answer for (i, _), answer in zip(asking, answers, strict=True)}
    out: list[CompiledPlan | RequestError] = []
    for i, item in enumerate(staged):
        if isinstance(item, RequestError):
            out.append(item)
            continue
        try:
            out.append(compile_resolved(item, verdicts.get(i)))
        except RequestError as exc:
            out.append(exc)
    return out


def _ask(resolved: Resolved) -> Ask:
    return Ask(resolved.policy, resolved.principal, resolved.candidates, resolved.request.purpose,
               resolved.contract.decision_type, resolved.when)
