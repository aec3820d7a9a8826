"""The 003 table in Markdown: this run's contenders beside the seed's own figures, and where freshplan loses."""

from __future__ import annotations

ROWS = (("Answer decision accuracy", "answer_decision_accuracy"), ("Accepted / 24", "accepted"),
        ("Relevant micro recall", "relevant_micro_recall"), ("Relevant documents retrieved / 19", "relevant_retrieved"),
        ("Answerable query recall", "answerable_query_recall"), ("Route accuracy", "route_accuracy"),
        ("ACL leakage queries", "acl_leakage_queries"), ("Abstentions", "abstentions"),
        ("Abstention precision", "abstention_precision"), ("Abstention recall", "abstention_recall"),
        ("Answer/abstain type accuracy", "answer_abstain_type_accuracy"),
        ("Mean retrieval steps", "mean_retrieval_steps"), ("Max retrieval steps", "max_retrieval_steps"),
        ("Mean latency work units", "mean_latency_work_units"),
        ("Total latency work units", "total_latency_work_units"), ("Total cost units", "total_cost_units"),
        ("Unit accepted cost", "unit_accepted_cost"))
# Why freshplan fails each kind of query: what the compiler does and does not judge.
WHY = {
    "false-answer": "the contract's only proposition is met by any permitted document of the tenant, so the "
                    "compiler reports SUFFICIENT whatever was asked; it judges admissibility and coverage of "
                    "declared propositions, not whether the text answers the question (no answerability check)",
    "answer-content-mismatch": "BM25 only orders candidates inside the slot and one document closes it, so a "
                               "paraphrase with no shared terms gets whichever document ranks first, and a "
                               "question needing two documents gets one",
    "false-abstain": "the plan was not SUFFICIENT although the answer was in the tenant's documents",
    "acl-leakage": "a document of another tenant reached the plan",
}


def _cell(value) -> str:
    return "n/a" if value is None else str(value)


def markdown(quality: dict) -> list[str]:
    """Lines of the 003 section of the bench summary."""
    proto, ours, seed = quality["protocol"], quality["metrics"], quality["seed_figures"]
    names = list(ours)
    lines = [f"## 003 evaluation ({proto['documents']} documents, {proto['tenants']} tenants, {proto['queries']} "
             f"frozen queries of which {proto['expected_abstain']} must abstain)", "",
             "Left: this run on this project's fixtures. Right: the 003 seed's published figures on its own "
             "corpus (not re-run here; same protocol, different documents and queries).", "",
             "| metric | " + " | ".join(names) + " | seed fixed one-shot | seed adaptive stateful |",
             "|---|" + "---|" * (len(names) + 2)]
    for label, key in ROWS:
        row = [_cell(ours[n].get(key)) for n in names] + [_cell(seed[s].get(key)) for s in seed]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    hard = [n for n in names if ours[n]["hard_failure"]]
    lines += ["", f"ACL leakage is a hard failure whatever the other figures: {', '.join(hard) or 'none'} "
              "failed it. Replayable payload: `" + quality["file"] + "`, sha256 (without capture time and "
              f"environment) `{quality['payload_sha256']}`.", "", "Where freshplan loses:", ""]
    by_kind: dict[str, list[str]] = {}
    for loss in quality["losses"]:
        for kind in loss["failures"]:
            by_kind.setdefault(kind, []).append(loss["query"])
    for kind, ids in sorted(by_kind.items()):
        lines.append(f"- {kind} ({len(ids)}: {', '.join(ids)}): {WHY.get(kind, kind)}.")
    if any(loss["query"].endswith("cross-tenant") for loss in quality["losses"]):
        lines.append("- the cross-tenant question was answered from the caller's own tenant (no leak): the "
                     "compiler does not stop when the query names another tenant's entity (issue 12 item 5, "
                     "stop reason `out_of_scope`), so this row changes when that lands.")
    return lines + [""]
